"""The doctor's contract: every signature in the source registers (its module is listed in
``diagnose.SIGNATURE_MODULES``, in the order they register), and a trend signature's fewest steps are declared once."""

from __future__ import annotations

import ast
from pathlib import Path

import rlgrad.doctor
from rlgrad.doctor import diagnose
from rlgrad.doctor.diagnose import SIGNATURE_MODULES
from rlgrad.doctor.findings import SIGNATURES, TRENDS, Thresholds
from tests.doctor.test_doctor import healthy_series, run_of

DOCTOR = Path(rlgrad.doctor.__file__).parent


def declared(source: str) -> list[str]:
    """The ids of the ``@signature("id", ...)`` decorators in ``source``, in order."""
    return [d.args[0].value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list if isinstance(d, ast.Call) and isinstance(d.func, ast.Name)
            and d.func.id == "signature" and d.args and isinstance(d.args[0], ast.Constant)]


def unregistered(sources: dict[str, str], registered: dict[str, str]) -> list[str]:
    """``module: id`` for each signature ``sources`` (module -> its source) declare that ``registered`` (id -> the
    module its rule came from) does not hold as that module's."""
    return [f"{module}: {sid}" for module, source in sources.items() for sid in declared(source)
            if registered.get(sid) != module]


def doctor_sources() -> dict[str, str]:
    return {f"rlgrad.doctor.{p.stem}": p.read_text() for p in sorted(DOCTOR.glob("*.py"))}


def test_every_signature_in_the_source_registers():
    registered = {sid: rule.__module__ for sid, _, rule in SIGNATURES}
    assert len(registered) == len(SIGNATURES) > 30  # one rule per id, and the registry is not empty
    assert unregistered(doctor_sources(), registered) == []
    assert sorted(registered) == sorted(sid for source in doctor_sources().values() for sid in declared(source))
    holding = {module for module, source in doctor_sources().items() if declared(source)}
    assert len(SIGNATURE_MODULES) == len(set(SIGNATURE_MODULES))  # each listed once
    assert {m.__name__ for m in SIGNATURE_MODULES} == holding


def test_signatures_register_in_the_order_of_the_list():
    order = [m.__name__ for m in SIGNATURE_MODULES]
    at = [order.index(rule.__module__) for _, _, rule in SIGNATURES]
    assert at == sorted(at) and at[0] == 0 and at[-1] == len(order) - 1


def test_the_registry_check_fails_on_a_module_left_off_the_list():
    registered = {sid: rule.__module__ for sid, _, rule in SIGNATURES}
    new = ('@signature("new_finding", "actor/entropy", reads="logs", fires="never")\n'
           "def _new(v, t):\n    return None\n")
    assert unregistered({**doctor_sources(), "rlgrad.doctor.newfile": new}, registered) == [
        "rlgrad.doctor.newfile: new_finding"]
    assert declared(new) == ["new_finding"] and declared("signature('x')\n") == []


def validations(accuracy: dict[int, float]):
    """A 20-step run whose training reward stays flat, validated at the steps of ``accuracy``."""
    s = healthy_series(20)
    s["critic/score/mean"] = [0.3] * 20
    run = run_of(s)
    for step, acc in accuracy.items():
        run.rows.setdefault(step, {})["val/accuracy"] = acc
    run.rows = dict(sorted(run.rows.items()))  # as a run's log holds them: step 0 first
    return diagnose(run)


def test_fewest_steps_are_declared_once_and_the_rule_judges_from_them():
    """``val_falls`` needs its best validation and two after it: 3 validations, the one before training (step 0)
    counted. It said 2 (docs/doctor.md's "judged from") and checked 3 in its body; now it declares 3, and with 2
    the doctor says it is too early instead of counting it as checked."""
    t = Thresholds()
    assert [TRENDS[sid][1](t) for sid in ("val_falls", "val_falls_train_rises", "length_truncated")] == [3, 3, 3]
    judged = validations({0: 0.8, 10: 0.3, 20: 0.3})
    assert "val_falls" not in judged.too_early
    assert [f.severity for f in judged.findings if f.id == "val_falls"] == ["critical"]  # below where it started
    early = validations({10: 0.8, 20: 0.3})
    assert early.too_early["val_falls"] == (2, 3) and "val_falls" not in [f.id for f in early.findings]
