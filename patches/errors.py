"""The patches' refusal of a model they do not cover (raised by the regions' checks and by `patches.check_model`)."""


class UnsupportedModelError(ValueError):
    """The model has layers or settings the patches do not implement: applying them would compute
    something else, or nothing, silently."""
