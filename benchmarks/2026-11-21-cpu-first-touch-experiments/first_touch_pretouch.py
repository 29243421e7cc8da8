"""cpu-parallel on the second layers: fresh output vs a torch.empty output zero-filled first (out=), and torch (dev experiment, see first_touch_experiments.txt)."""
import time, torch, numpy as np, torch.nn.functional as F
from convforge import conv
torch.set_num_threads(2)
shapes={"sp19 L2":(10000,6,22,22,16,5),"sp18 L2":(10000,6,30,30,16,5),"fa20 L2":(10000,4,40,40,16,7)}
for name,(B,C,H,W,M,K) in shapes.items():
    x=torch.rand(B,C,H,W)*255; w=torch.randn(M,C,K,K)*0.05
    fn=conv.get("cpu-parallel").prepare(w,None)
    shape=(B,M,H-K+1,W-K+1)
    def fresh(): return fn(x)
    def pre(): 
        o=torch.empty(shape); o.zero_(); return fn(x,o)
    def tor(): return F.conv2d(x,w)
    res={}
    for rnd in range(5):
        for lab,f in (("fresh",fresh),("pretouch",pre),("torch",tor)):
            t=time.perf_counter(); f(); res.setdefault(lab,[]).append(time.perf_counter()-t)
    print(name, {k:round(np.median(v)*1e3,1) for k,v in res.items()}, flush=True)
