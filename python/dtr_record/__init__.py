"""Record PyTorch programs as dtr traces (``docs/trace-format.md``).

Built on ``TorchDispatchMode``: no patched PyTorch. See ``recorder.py`` for
what is recorded and how, and ``python -m dtr_record --help`` for the
command line.
"""

from .recorder import TraceRecorder, record_training

__all__ = ["TraceRecorder", "record_training"]
