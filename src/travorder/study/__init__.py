"""The study: specs, jobs, the runner (joblib / Ray), the result store, export and report.

`run_study` runs a spec's jobs into a SQLite `ResultStore`; `export_dataset` turns a
store into the predictor's dataset; `write_report` draws it. See docs/study.md. The names
load lazily, so the scenarios (`travorder.study.scenarios`) are usable without the runner.
"""

from travorder._lazy import lazy_exports

_EXPORTS = {
    "BACKENDS": "travorder.study.runner",
    "Job": "travorder.study.jobs",
    "ResultStore": "travorder.study.store",
    "Scenario": "travorder.study.scenarios",
    "StudySpec": "travorder.study.spec",
    "StudySummary": "travorder.study.runner",
    "load_spec": "travorder.study.spec",
    "prepare_graph": "travorder.graph",
    "run_job": "travorder.study.jobs",
    "run_study": "travorder.study.runner",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
