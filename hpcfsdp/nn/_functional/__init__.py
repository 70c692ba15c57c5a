"""Implementation modules of hpcfsdp.nn.functional (convolution, pooling, padding, losses, activations).

At the level of nn.functional (the tensor core), below nn's modules; nn.functional re-exports their names.
"""
