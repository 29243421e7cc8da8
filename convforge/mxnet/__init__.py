"""MXNet checkpoints without MXNet: run the course's own ``PREFIX-symbol.json`` + ``PREFIX-NNNN.params``.

The course (UIUC ECE 408) shipped its models as MXNet checkpoints. This module reads them, unchanged,
into a convforge ``Network`` (so every registered convolution implementation runs them), describes
them, and writes networks back in the same format (``convforge export --mxnet PREFIX``).

The two files
-------------
``PREFIX-symbol.json`` is the graph: ``nodes`` (each with ``op``, ``name``, ``inputs`` as
``[node, output, version]`` and string attributes under ``attrs``, or ``attr``/``param`` in files from
before MXNet 0.9), ``arg_nodes``, ``heads`` and graph ``attrs``. Variables are nodes with op ``null``.

``PREFIX-NNNN.params`` (NNNN the epoch, ``%04d``) is an NDArray list, little-endian:

    u64 0x112, u64 reserved, u64 array count, the arrays, u64 name count, the names
    array: u32 magic 0xF993FAC9, i32 storage type (0 dense), u32 ndim, ndim x i64 dims,
           i32 device type, i32 device id, i32 dtype flag (0 float32, 1 float64, 2 float16), the values
    name:  u64 length, that many bytes of UTF-8, e.g. ``arg:convolution0_weight`` (``aux:`` for
           auxiliary states); names pair with the arrays in order

The array format of MXNet >= 1.6's NumPy mode (magic 0xF993FACA, same layout for a dense array) is
read too. Version 1 (0xF993FAC8), the pre-0.9 legacy layout (no magic), sparse storage and integer
dtypes are refused with a message saying so; float64 and float16 values are widened or rounded to
float32, the precision the engine computes in.

What runs
---------
A chain of layers from the data variable to the single head, each operator's other inputs being
variables held in the .params file:

    Convolution      kernel (square), num_filter, no_bias; stride 1, pad 0, dilate 1, num_group 1 only
    New              the course's own convolution (kernel, num_filter, no bias), as op ``New`` or as
                     op ``Custom`` with ``op_type`` ``New``
    Activation       act_type tanh, relu or sigmoid
    Pooling          pool_type max or avg, kernel and stride (square; MXNet's default stride is 1),
                     pooling_convention valid or full (ceil mode); no padding, no global_pool
    Flatten          (also spelled ``flatten``)
    FullyConnected   num_hidden, no_bias; flatten=True (the default) flattens a 4-D input, so a
                     Flatten layer is inserted there
    SoftmaxOutput    the head only (also its old name ``Softmax``); skipped, as argmax is unchanged

Performance hints (workspace, cudnn_tune, cudnn_off) and attributes in double underscores
(``__lr_mult__``, ``__shape__`` ...) are ignored; any other operator, attribute or value is a
one-line error (``UserError``) naming it, as is every malformed, truncated or mismatched file.

Input size
----------
An explicit ``input_size`` wins; else the data variable's ``__shape__`` attribute (written by
``save_checkpoint``); else the first FullyConnected layer's weight width: the input size S is searched
so that the graph gives exactly that many values. Floor pooling makes several S fit (48 and 49 for the
course baseline): the smallest is taken, and the range is reported; a model trained at another of
them needs ``input_size`` (``--input-size``). The test images are then course-resized to S.

Writing
-------
``save_checkpoint`` writes what MXNet 1.3.1's ``save_checkpoint`` would: nodes auto-named as MXNet
does (``convolution0``, ``fullyconnected1_bias`` ...), a SoftmaxOutput head with its label variable,
float32 dense arrays named ``arg:...``, plus ``__shape__`` on the data variable so the input size
survives the round trip. Each file goes to a temporary name first and is renamed into place.

Modules: ``format`` (the two files, read and encoded), ``graph`` (graph -> Network, the input size),
``export`` (describe, symbol_json, save_checkpoint), ``command`` (``convforge export``; options in cli.py).
API: ``load_network``, ``describe``, ``save_checkpoint``, ``read_params``, ``encode_params``, ``symbol_json``.
"""

from __future__ import annotations

from convforge.mxnet.export import describe, save_checkpoint, symbol_json
from convforge.mxnet.format import encode_params, read_params
from convforge.mxnet.graph import load_network

__all__ = ["load_network", "describe", "save_checkpoint", "read_params", "encode_params", "symbol_json"]
