"""The study: specs, jobs, the runner (joblib / Ray), the result store, export and report.

`run_study` runs a spec's jobs into a SQLite `ResultStore`; `export_dataset` turns a
store into the predictor's dataset; `write_report` draws it. See docs/study.md.
"""

from travorder.graph import prepare_graph
from travorder.study.jobs import Job, run_job
from travorder.study.runner import BACKENDS, StudySummary, run_study
from travorder.study.spec import StudySpec, load_spec
from travorder.study.store import ResultStore

__all__ = [
    "BACKENDS",
    "Job",
    "ResultStore",
    "StudySpec",
    "StudySummary",
    "load_spec",
    "prepare_graph",
    "run_job",
    "run_study",
]
