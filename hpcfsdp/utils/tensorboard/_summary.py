"""Summary protos of PyTorch's SummaryWriter methods, built with the tensorboard package's own protos."""
import numpy as np

__all__ = ["scalar", "histogram", "text", "hparams", "to_numpy", "to_float"]


def to_float(value) -> float:
    """A Python float from a number, a one-element array or Tensor (``.item()``)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a real number or a one-element Tensor/array, got {type(value).__name__} {value!r}")
    return float(value)


def to_numpy(values) -> np.ndarray:
    """A NumPy array from a Tensor (host or device), an array or a sequence."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        values = values.detach().cpu()
    arr = np.asarray(values)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise TypeError(f"expected numbers (a Tensor, an array or a sequence), got dtype {arr.dtype}")
    return arr


def scalar(tag, value, *, new_style=False, double_precision=False):
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.util import tensor_util

    value = to_float(value)
    if not new_style:  # the TF1 "simple_value" (float32) that every TensorBoard reads
        return Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    tensor = tensor_util.make_tensor_proto(np.float64(value) if double_precision else np.float32(value))
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=meta)])


# TensorFlow's default histogram buckets (what PyTorch's bins="tensorflow" means): +-1e-12 * 1.1**k up to 1e20.
def _tensorflow_edges():
    pos = [1e-12]
    while pos[-1] < 1e20:
        pos.append(pos[-1] * 1.1)
    return np.array([-x for x in reversed(pos)] + [0.0] + pos)


def histogram(tag, values, bins="tensorflow", max_bins=None):
    from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

    arr = to_numpy(values).astype(np.float64).ravel()
    if arr.size == 0:
        raise ValueError(f"add_histogram({tag!r}): the values are empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"add_histogram({tag!r}): the values hold NaN or infinity")
    edges = _tensorflow_edges() if isinstance(bins, str) and bins == "tensorflow" else bins
    counts, limits = np.histogram(arr, bins=edges)
    if max_bins is not None and len(counts) > max_bins:  # merge neighbours until at most max_bins remain
        k = -(-len(counts) // max_bins)  # old buckets per new one
        m = -(-len(counts) // k)  # new buckets
        counts = np.concatenate([counts, np.zeros(m * k - len(counts), counts.dtype)]).reshape(m, k).sum(axis=1)
        limits = np.concatenate([limits[:m * k:k], limits[-1:]])
    nz = np.nonzero(counts)[0]  # drop the empty buckets at both ends (keep one empty bucket before the first)
    lo, hi = max(int(nz[0]) - 1, 0), int(nz[-1]) + 1
    proto = HistogramProto(min=float(arr.min()), max=float(arr.max()), num=float(arr.size), sum=float(arr.sum()),
                           sum_squares=float(np.dot(arr, arr)), bucket_limit=[float(x) for x in limits[lo + 1:hi + 1]],
                           bucket=[float(c) for c in counts[lo:hi]])
    return Summary(value=[Summary.Value(tag=tag, histo=proto)])


def text(tag, text_string):
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text import metadata as text_metadata
    from tensorboard.util import tensor_util

    if not isinstance(text_string, str):
        raise TypeError(f"add_text({tag!r}): expected a str, got {type(text_string).__name__}")
    tensor = tensor_util.make_tensor_proto([text_string.encode("utf-8")])
    meta = text_metadata.create_summary_metadata(display_name=None, description=None)
    return Summary(value=[Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor)])


def _hparam_value(name, value):
    """The protobuf Value of one hparam and its HParams data type (int, float, str, bool as PyTorch takes)."""
    from google.protobuf import struct_pb2

    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value), "DATA_TYPE_BOOL"
    if isinstance(value, (int, float)):
        return struct_pb2.Value(number_value=float(value)), "DATA_TYPE_FLOAT64"
    if isinstance(value, str):
        return struct_pb2.Value(string_value=value), "DATA_TYPE_STRING"
    if hasattr(value, "item"):
        return _hparam_value(name, value.item())
    raise ValueError(f"add_hparams: hparam {name!r} = {value!r}: expected an int, float, str, bool or a "
                     "one-element Tensor")


def hparams(hparam_dict, metric_dict, hparam_domain_discrete=None):
    """The three summaries of the HParams plugin: experiment, session start (the values), session end."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    from tensorboard.plugins.hparams import metadata as hp_metadata

    if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
        raise TypeError("add_hparams: hparam_dict and metric_dict must be dicts")
    domains = hparam_domain_discrete or {}
    if not isinstance(domains, dict):
        raise TypeError("add_hparams: hparam_domain_discrete must be a dict of lists")
    for name, choices in domains.items():
        if name not in hparam_dict:
            raise ValueError(f"add_hparams: hparam_domain_discrete names {name!r}, which is not in hparam_dict")
        if not isinstance(choices, (list, tuple)) or not all(type(c) is type(hparam_dict[name]) for c in choices):
            raise TypeError(f"add_hparams: hparam_domain_discrete[{name!r}] must be a list of values of the same "
                            f"type as hparam_dict[{name!r}]")
    start = plugin_data_pb2.SessionStartInfo()
    infos = []
    for name, value in hparam_dict.items():
        if value is None:
            continue
        pb, kind = _hparam_value(name, value)
        start.hparams[name].CopyFrom(pb)
        info = api_pb2.HParamInfo(name=name, type=api_pb2.DataType.Value(kind))
        if name in domains:
            info.domain_discrete.extend([_hparam_value(name, c)[0] for c in domains[name]])
        infos.append(info)
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict]
    exp = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
    version = hp_metadata.PLUGIN_DATA_VERSION
    out = []
    for tag, field, pb in ((hp_metadata.EXPERIMENT_TAG, "experiment", exp),
                           (hp_metadata.SESSION_START_INFO_TAG, "session_start_info", start),
                           (hp_metadata.SESSION_END_INFO_TAG, "session_end_info", end)):
        data = plugin_data_pb2.HParamsPluginData(version=version, **{field: pb})
        meta = hp_metadata.create_summary_metadata(data)
        out.append(Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=hp_metadata.NULL_TENSOR)]))
    return out
