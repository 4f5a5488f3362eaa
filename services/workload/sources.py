"""Where a workload service finds what a workload config names: its models (`ModelZoo`: shipped, registered,
inline), its recorded routing traces (`RecordedFiles`) and its arrival traces (`ArrivalFiles`). One
`WorkloadSources` per workload app, built from the app's settings in ``create_app``; the offline functions
(``traces.make_plan``, the CLI's ``tasmoe trace``) take one too, and default to `packaged` (the shipped models and
traces only: package data, the same in every process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from services.workload.arrival_files import ArrivalFiles
from services.workload.recorded_files import RecordedFiles
from services.workload.zoo import ModelZoo
from shared.settings import Settings


@dataclass(frozen=True)
class WorkloadSources:
    zoo: ModelZoo
    recorded: RecordedFiles
    arrivals: ArrivalFiles = field(default_factory=ArrivalFiles)  # default: the packaged ones only

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkloadSources:
        """The models folder, the traces folder and the cache size of ``settings``."""
        return cls(ModelZoo.from_settings(settings), RecordedFiles.from_settings(settings),
                   ArrivalFiles.from_settings(settings))

    @classmethod
    def packaged(cls) -> WorkloadSources:
        """The shipped models, sample routing traces and arrival traces only (nothing registered, no folder read):
        package data, the same in every process, so one object serves every caller (its LRUs keep a parsed trace
        across calls)."""
        return _packaged()


@cache
def _packaged() -> WorkloadSources:
    return WorkloadSources(ModelZoo(), RecordedFiles(), ArrivalFiles())
