"""`python -m trainer` is `python -m trainer.task`."""
from trainer.task import _exit, main

if __name__ == "__main__":
    _exit(main())
