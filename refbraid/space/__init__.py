"""Model parallelism inside a layer (DistDL, Hewett & Grady 2020; docs/references.md §5).

A conv network's feature maps are split by image rows over the ranks of a communicator; every
exchange is a linear operator of :mod:`refbraid.parallel.ops` with its hand-written adjoint:

* :mod:`.halo`     ``RowSplit`` (who owns which rows) and ``SpatialHalo`` (the two-sided halo
                   exchange of a 3×3 stencil, built from ``HaloExchange``);
* :mod:`.layers`   the conv ODE step and lift on a row block (halo, then a convolution valid in
                   the split direction), and the closing dense layer with its weight columns
                   split like its input (partial products, then ``SumReduce``);
* :mod:`.dense`    dense layers with weights split by rows (broadcast in, sum-reduce of the
                   input adjoint) or by columns (sum-reduce out, broadcast of the adjoint);
* :mod:`.network`  forward and backprop of a whole conv :class:`~refbraid.network.Network`
                   with every feature map split: the same loss and gradients as one process.
"""

from .dense import ColumnSplitDense, RowSplitDense
from .halo import RowSplit, SpatialHalo
from .layers import SpatialClassifier, SpatialConvLift, SpatialConvStep, conv_rows
from .network import SpatialNetwork

__all__ = ["ColumnSplitDense", "RowSplit", "RowSplitDense", "SpatialClassifier",
           "SpatialConvLift", "SpatialConvStep", "SpatialHalo", "SpatialNetwork", "conv_rows"]
