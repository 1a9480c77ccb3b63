"""Every setting declared once (engine.config.declare), everything else generated from it.

From one declaration per setting: its `lineage serve` option, its environment
lookup in `EngineConfig.from_sources` and its row in docs/serving.md. Checked
here for every setting at once: the variable is honoured, the flag gives the same
value and wins over the variable, a bad value is refused naming both, booleans
are strict, and the docs' table is the one the code writes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from clients.cli import main as cli
from clients.cli.args import config_from_args
from engine.config import EngineConfig, format_bytes, parse_bool, parse_bytes
from engine.config.catalog import SETTINGS, branches, markdown, with_table
from engine.config.declare import parse_float, parse_int, parse_str, settings_of

ROOT = Path(__file__).resolve().parents[2]
# Settings that need a partner (TLS files) or read a file (tokens): tests/server/test_auth.py;
# --draft-model needs --speculative draft or auto: tests/runtime/speculative/test_draft_model.py.
# --model and --pin name models (a pin must name a declared one): tests/config/test_fleet.py.
PAIRED = (
    *("tls_cert", "tls_key", "tls_client_ca", "auth_token", "auth_token_file", "draft_model"),
    *("model", "pin"),
)
SIMPLE = [s for s in SETTINGS if s.name not in PAIRED]
BRANCH = {cls: f.name for cls, f in zip(branches(), dataclasses.fields(EngineConfig))}


def _branch(setting) -> str:
    return next(BRANCH[cls] for cls in branches() if setting in settings_of(cls))


def _sample(s, k: int = 0) -> tuple[str, object]:
    """(text, parsed value) of a valid value; k=0: other than the default; k=1: another.

    A repeated setting's text holds two values, one a line; they add to its default."""
    if s.repeat:
        values = (f"^sample-{k}a", f"^sample-{k}b")
        return "\n".join(values), tuple(s.default) + values
    if s.choices:
        choice = [c for c in s.choices if c != s.default][0] if k == 0 else s.default
        return choice, choice
    if s.parse is parse_bool:
        value = not s.default if k == 0 else bool(s.default)
        return ("on" if value else "off"), value
    if s.parse is parse_bytes:
        return f"{3 + k}M", (3 + k) << 20
    if s.parse is parse_float:
        return f"{7.5 + k}", 7.5 + k
    if s.parse is parse_str:
        return f"/tmp/lineage-sample-{k}", f"/tmp/lineage-sample-{k}"
    number = (s.default if isinstance(s.default, int) else 0) + 3 + k  # ints and replicas
    return str(number), number


def _value(config: EngineConfig, s):
    return getattr(getattr(config, _branch(s)), s.field)


def test_names_flags_and_variables_are_unique():
    for attribute in ("name", "flag", "var"):
        values = [getattr(s, attribute) for s in SETTINGS if getattr(s, attribute)]
        assert len(values) == len(set(values)), attribute
    assert len(SETTINGS) > 60 and all(s.help and s.var.startswith("LINEAGE_") for s in SETTINGS)


@pytest.mark.parametrize("s", SIMPLE, ids=lambda s: s.name)
def test_the_variable_is_honoured(s):
    text, expected = _sample(s)
    assert _value(EngineConfig.from_sources({}, {s.var: text}), s) == expected


@pytest.mark.parametrize("s", [s for s in SIMPLE if s.flag], ids=lambda s: s.name)
def test_the_flag_gives_the_same_value_and_wins_over_the_variable(s):
    text, expected = _sample(s)
    if s.switch:  # given: on
        text, expected = "", True
    argv = ["serve", s.flag] + ([text] if text else [])
    if s.repeat:  # the flag once per value
        argv = ["serve"] + [a for value in text.splitlines() for a in (s.flag, value)]
    env = {s.var: "off" if s.switch else _sample(s, 1)[0]}  # valid, and not the flag's value
    args = cli.build_parser().parse_args(argv)
    assert _value(config_from_args(args, env), s) == expected


@pytest.mark.parametrize(
    "s",
    [s for s in SETTINGS if s.parse is not parse_str and s.name != "model"],
    ids=lambda s: s.name,
)
def test_a_bad_value_is_refused_naming_the_flag_and_the_variable(s):
    with pytest.raises(ValueError) as error:
        EngineConfig.from_sources({}, {s.var: "?!"})
    assert str(error.value).startswith(s.label + ":"), error.value
    if s.flag and not s.switch:
        with pytest.raises(ValueError) as error:
            EngineConfig.from_sources({s.name: "?!"}, {})
        assert s.label in str(error.value)


@pytest.mark.parametrize("argv", [["--prefill-overlap", "maybe"], ["--max-batch", "many"]])
def test_the_cli_refuses_a_bad_value_naming_the_flag_and_the_variable(argv, capsys):
    from tests.clients.test_cli import run_cli

    assert run_cli(["serve", *argv])[0] == 2
    err = capsys.readouterr().err
    var = "LINEAGE_" + argv[0][2:].upper().replace("-", "_")
    assert f"{argv[0]} ({var}): {argv[1]!r}" in err


@pytest.mark.parametrize(
    "text, value",
    [("on", True), ("OFF", False), ("true", True), ("False", False), ("1", True), (" 0 ", False)],
)
def test_booleans_read_on_off_true_false_1_0(text, value):
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["maybe", "yes", "no", "", "2", "onn"])
def test_any_other_boolean_is_refused(text):
    with pytest.raises(ValueError, match="is not on/off"):
        parse_bool(text)
    with pytest.raises(ValueError, match=r"--prefill-overlap \(LINEAGE_PREFILL_OVERLAP\)"):
        EngineConfig.from_sources({"prefill_overlap": text}, {})


def test_a_switch_takes_no_value_on_the_command_line_and_on_off_in_its_variable():
    args = cli.build_parser().parse_args(["serve", "--insecure"])
    assert config_from_args(args, {}).server.insecure
    assert EngineConfig.from_sources({}, {"LINEAGE_INSECURE": "on"}).server.insecure
    with pytest.raises(ValueError, match=r"--insecure \(LINEAGE_INSECURE\): 'yes'"):
        EngineConfig.from_sources({}, {"LINEAGE_INSECURE": "yes"})


def test_a_bad_integer_names_the_flag_and_the_variable():
    with pytest.raises(ValueError, match=r"^--max-batch \(LINEAGE_MAX_BATCH\): 'many' is not"):
        EngineConfig.from_sources({}, {"LINEAGE_MAX_BATCH": "many"})
    assert parse_int(" 12 ") == 12
    with pytest.raises(ValueError):
        parse_int(True)


def test_the_docs_table_is_the_one_the_code_writes():
    """Regenerate with `python -m engine.config.catalog --write docs/serving.md`."""
    text = (ROOT / "docs" / "serving.md").read_text()
    assert with_table(text) == text
    for s in SETTINGS:
        assert f"`{s.var}`" in text


def test_the_table_has_a_row_per_setting():
    rows = [line for line in markdown().splitlines() if line.startswith("| ")]
    assert len(rows) == len(SETTINGS) + len(branches())  # plus one header per branch


@pytest.mark.parametrize("n", [0, 512, 1 << 10, 48 << 30, 16 << 20, 1 << 40, 3 << 40])
def test_a_formatted_size_reads_back(n):
    assert parse_bytes(format_bytes(n)) == n


def test_sizes_are_binary_and_formatted_as_such():
    assert parse_bytes("48G") == 48 << 30 == parse_bytes("48 GiB") == parse_bytes("48gb")
    assert format_bytes(48 << 30) == "48.0 GiB"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(100) == "100 B"
    n = 12_345_678
    assert abs(parse_bytes(format_bytes(n)) - n) / n < 0.01
