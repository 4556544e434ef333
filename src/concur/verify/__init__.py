"""The verifier: compile, check and time candidate kernels against their reference programs.

Public functions (concur.verify.api): compile_frame, verify_frame, verify_one, probe_tasks, run, compile_run,
normalize_settings; VerifySettings, the typed settings they take (concur.verify.settings). docs/verifier.md describes
the design; docs/data.md §4 and §4a the tables it writes.
Submodules are imported lazily, so the processes of the verifier (zygote, referee, contestant) start light.
"""

_API = (
    "compile_frame",
    "verify_frame",
    "verify_one",
    "probe_tasks",
    "run",
    "compile_run",
    "normalize_settings",
    "VerifySettings",
)


def __getattr__(name: str):
    if name in _API:
        from concur.verify import api

        return getattr(api, name)
    raise AttributeError(f"module 'concur.verify' has no attribute {name!r}")
