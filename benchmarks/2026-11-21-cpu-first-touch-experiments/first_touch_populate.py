"""First-touch cost of a fresh 207 MB output: a 2-thread fill_ that faults it in, against madvise(MADV_POPULATE_WRITE) from one and two threads (dev experiment, see first_touch_experiments.txt)."""
import ctypes, time, torch, numpy as np, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes=[ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_POPULATE_WRITE=23
n = 10000*16*18*18  # sp19 L2 output floats
def touch_fault():
    t=torch.empty(n); t0=time.perf_counter(); t.fill_(0); return time.perf_counter()-t0
def touch_pop(threads=1):
    t=torch.empty(n); t0=time.perf_counter()
    a=t.data_ptr(); L=n*4
    start=(a+4095)//4096*4096; end=(a+L)//4096*4096
    if threads==1:
        r=libc.madvise(start,end-start,MADV_POPULATE_WRITE); assert r==0, ctypes.get_errno()
    else:
        mid=(start+(end-start)//2)//4096*4096
        ths=[threading.Thread(target=libc.madvise,args=(s,e-s,MADV_POPULATE_WRITE)) for s,e in ((start,mid),(mid,end))]
        [x.start() for x in ths]; [x.join() for x in ths]
    t1=time.perf_counter(); t.fill_(0); t2=time.perf_counter()
    return t1-t0, t2-t1
torch.set_num_threads(2)
for i in range(3):
    print("fault+fill", touch_fault(), "pop1", touch_pop(1), "pop2", touch_pop(2))
