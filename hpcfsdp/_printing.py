"""torch.set_printoptions: how a Tensor's repr prints its values (precision, summarisation, line width,
scientific notation), read by TensorBase.__repr__."""
import math
import sys

import numpy as np

__all__ = ["set_printoptions", "format_array"]

# PyTorch's profiles: the options each sets (the others keep their values)
_PROFILES = {
    "default": {"precision": 4, "threshold": 1000, "edgeitems": 3, "linewidth": 80},
    "short": {"precision": 2, "threshold": 1000, "edgeitems": 2, "linewidth": 80},
    "full": {"precision": 4, "threshold": math.inf, "edgeitems": 3, "linewidth": 80},
}
_OPTIONS = dict(_PROFILES["default"], sci_mode=None)


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None, profile=None, sci_mode=None):
    """Set the print options of tensors' repr: ``precision`` digits after the point (4), ``threshold`` elements
    above which the repr is summarised (1000), ``edgeitems`` shown at each end of a summarised dim (3),
    ``linewidth`` characters per line (80), a ``profile`` ('default', 'short', 'full') setting those first, and
    ``sci_mode`` (True: always scientific, False: never, None: as the values need)."""
    if profile is not None and profile in _PROFILES:
        _OPTIONS.update(_PROFILES[profile])
    for k, v in (("precision", precision), ("threshold", threshold), ("edgeitems", edgeitems),
                 ("linewidth", linewidth)):
        if v is not None:
            _OPTIONS[k] = v
    _OPTIONS["sci_mode"] = sci_mode  # as PyTorch: each call sets it, None restoring the automatic choice


def format_array(a, prefix):
    """The values part of a repr of NumPy array ``a`` under the current print options."""
    o = _OPTIONS
    threshold = o["threshold"]
    kwargs = {}
    if o["sci_mode"] is True and a.dtype.kind == "f":
        p = o["precision"]
        kwargs["formatter"] = {"float_kind": lambda v: f"{v:.{p}e}"}
    elif o["sci_mode"] is False:
        kwargs["suppress_small"] = True
        if a.dtype.kind == "f":
            p = o["precision"]
            kwargs["formatter"] = {"float_kind": lambda v: f"{v:.{p}f}"}
    # as PyTorch: integral values print as "1.", any other float tensor with exactly ``precision`` decimals
    mode = "maxprec_equal"
    if a.dtype.kind == "f" and a.size:
        fin = np.abs(a[np.isfinite(a)])
        big = fin[fin != 0]
        sci = big.size and (big.max() / big.min() > 1000.0 or big.max() > 1e8)  # PyTorch's switch to e-notation
        if fin.size and (sci or not bool((fin == np.round(fin)).all())):
            mode = "fixed"
    return np.array2string(a, separator=", ", prefix=prefix, precision=o["precision"], floatmode=mode,
                           threshold=sys.maxsize if threshold == math.inf else int(threshold),
                           edgeitems=int(o["edgeitems"]), max_line_width=int(o["linewidth"]), **kwargs)
