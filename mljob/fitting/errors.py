"""The refusal `model.fit` raises, before training, for what it cannot run as Keras runs
it under the model's strategy: one line naming the problem and the fix, exit status 2
(the launcher prints it as `error: ...`)."""
from mljob.errors import UsageError


class FitRefused(UsageError):
    """What cannot run as Keras runs it under this strategy; said before training."""


__all__ = ["FitRefused"]
