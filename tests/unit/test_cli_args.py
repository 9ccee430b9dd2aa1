"""The `rlhf` command line: `run`'s KEY=VALUE overrides go anywhere among its options."""

import pytest

from flows.cli.main import parse_args


def test_overrides_before_between_and_after_options_are_all_taken_in_order():
    args = parse_args(["run", "seed=7", "--only", "rm", "rm.lr=1e-3", "--force", "sft", "rm.max_steps=5"])
    assert args.overrides == ["seed=7", "rm.lr=1e-3", "rm.max_steps=5"]
    assert args.only == ["rm"] and args.force == ["sft"]


def test_an_unknown_option_is_still_rejected(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["run", "--only", "rm", "k=v", "--forse", "sft"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --forse" in capsys.readouterr().err


def test_other_commands_take_no_stray_arguments(capsys):
    with pytest.raises(SystemExit):
        parse_args(["runs", "--limit", "3", "k=v"])
    assert "unrecognized arguments: k=v" in capsys.readouterr().err
