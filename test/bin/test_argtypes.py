"""Boolean options: one convention (``--opt true|false``) across the spkflow.bin commands."""

from __future__ import annotations

import argparse
import ast

import pytest

from helpers.paths import ROOT
from spkflow.bin.argtypes import add_bool_option, float_at_least

# store_true/store_false flags still allowed, and why
EXCEPTIONS = {
    "datadir.py": "the flags of the Kaldi scripts it implements (validate_data_dir.sh --no-feats ...)",
    "align_embed_scp.py": "--check-only: align_embed_scp.sh (jobs helper) passes it bare before positionals",
}


def parser(**kw: object) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x", exit_on_error=False)
    add_bool_option(p, "--progress", default=True, help="bar", **kw)  # type: ignore[arg-type]
    p.add_argument("data", nargs="?")
    return p


def test_true_false_values_and_the_old_negative_flag() -> None:
    p = parser(old_negative="--no-progress")
    assert p.parse_args([]).progress is True
    assert p.parse_args(["--progress", "false"]).progress is False
    assert p.parse_args(["--progress", "true", "d"]).progress is True
    assert p.parse_args(["--no-progress", "d"]) == argparse.Namespace(progress=False, data="d")
    assert "--no-progress" not in p.format_help() and "--progress true|false" in p.format_help()


def test_bad_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser(prog="x")
    add_bool_option(p, "--resume", default=True, help="r")
    with pytest.raises(SystemExit) as err:
        p.parse_args(["--resume", "maybe"])
    assert err.value.code == 2 and "expected true or false, got 'maybe'" in capsys.readouterr().err


def test_bare_flag_only_when_asked() -> None:
    assert parser(bare=True).parse_args(["--progress"]).progress is True
    with pytest.raises(argparse.ArgumentError):
        parser().parse_args(["--progress"])  # a value is required: a positional is never swallowed


def _flag_actions(path) -> list[str]:
    """Options registered with action=store_true/store_false and a visible help text."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            kw = {k.arg: k.value for k in node.keywords}
            action = kw.get("action")
            hidden = isinstance(kw.get("help"), ast.Attribute) and kw["help"].attr == "SUPPRESS"
            if isinstance(action, ast.Constant) and action.value in ("store_true", "store_false") and not hidden:
                found.append(ast.unparse(node.args[0]) if node.args else "?")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "spkflow" / "bin").glob("*.py")), ids=lambda p: p.name)
def test_commands_take_true_false(path) -> None:
    found = _flag_actions(path)
    if path.name in EXCEPTIONS:  # still needed? (remove the entry once the flags are gone)
        assert found, f"{path.name} has no store_true flag left: drop it from EXCEPTIONS"
    else:
        assert found == [], f"{path.name}: use spkflow.bin.argtypes.add_bool_option (--opt true|false)"


def test_float_at_least_refuses_values_below_the_bound_nan_and_words() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reg", type=float_at_least(0.0), default=0.1)
    assert p.parse_args(["--reg", "0"]).reg == 0.0 and p.parse_args(["--reg", "2.5"]).reg == 2.5
    for bad in ("-0.1", "nan", "abc"):
        with pytest.raises(SystemExit):
            p.parse_args(["--reg", bad])
    parse = float_at_least(0.0)
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 0, got -1"):
        parse("-1")
    with pytest.raises(argparse.ArgumentTypeError, match="invalid number 'abc'"):
        parse("abc")
