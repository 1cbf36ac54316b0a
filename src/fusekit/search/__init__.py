"""Search infrastructure shared by the parts: executors that run evaluations in parallel.

Only the executors exist so far; config spaces, pruning, measurement and caches come with the
issues that need them.
"""

from fusekit.search.executor import Executor as Executor
from fusekit.search.executor import LocalExecutor as LocalExecutor
from fusekit.search.executor import SerialExecutor as SerialExecutor
from fusekit.search.executor import default_workers as default_workers

__all__ = ["Executor", "LocalExecutor", "SerialExecutor", "default_workers"]
