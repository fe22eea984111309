"""Read datasets built by the Beam pipeline: `info(path)` and `make_dataset(path, ...)`.

Needs TensorFlow, never Apache Beam. `import readers` loads neither: TensorFlow is imported
when a function that needs it runs (the format itself, `dataset_format/`, is pure Python).
"""

__all__ = ["Fields", "Position", "info", "make_dataset"]


def __getattr__(name):
    if name == "info":
        from dataset_format.dataset_info import info  # lazy: no TF at import
        return info
    if name == "make_dataset":
        from readers.dataset import make_dataset  # lazy: no TF at import
        return make_dataset
    if name == "Fields":
        from readers.fields import Fields  # lazy: no TF at import
        return Fields
    if name == "Position":
        from readers.order import Position  # lazy: no TF at import
        return Position
    raise AttributeError(f"module 'readers' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
