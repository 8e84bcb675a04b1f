"""``inalab decide``'s workers against the profile's: without ``--workers`` the profile's
one count, said so; another count than the profile was fitted at, warned; a profile that
cannot say, refused. In process, through ``dynamiccl.cli.main``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dynamiccl.cli import main
from dynamiccl.model import DEFAULT_PROFILE

NOTE = (
    "inalab decide: note: no --workers given: deciding for 4, the worker count the profile"
    " was fitted at\n"
)


def _saved(tmp_path: Path, workers: tuple[int, ...] | None) -> str:
    path = tmp_path / "profile.json"
    replace(DEFAULT_PROFILE, workers=workers).save(path)
    return str(path)


def test_without_workers_the_built_in_profiles_count_is_used_and_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--size", "4K"]) == 0
    out, err = capsys.readouterr()
    assert err == NOTE
    assert out.startswith("# allreduce of 4K (4096 bytes), 4 workers\n")
    assert main(["--size", "4K", "--workers", "4"]) == 0
    assert capsys.readouterr() == (out, "")  # the same decision, nothing to say


def test_json_says_which_counts_the_profile_was_fitted_at(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--size", "4K", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["workers"], doc["profile_workers"]) == (4, [4])
    assert err == NOTE


def test_workers_the_profile_was_not_fitted_at_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--size", "4K", "--workers", "8"]) == 0
    out, err = capsys.readouterr()
    assert "8 workers" in out.splitlines()[0]
    assert err == (
        "inalab decide: warning: 8 workers, but the profile was fitted at 4: a calibration's"
        " ranks share the machine's cores, so its times hold for those counts; fit 8"
        " (inalab calibrate --workers 8 -o PROFILE, or inalab emulate TOPOLOGY calibrate with"
        " a job of 8 ranks) and pass --profile PROFILE\n"
    )
    several = _saved(tmp_path, (2, 4, 8))
    assert main(["--size", "4K", "--workers", "8", "--profile", several]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--size", "4K", "--workers", "3", "--profile", several]) == 0
    assert "fitted at 2, 4, 8" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("workers", "why"),
    [(None, "it records none"), ((2, 4), "it was fitted at 2, 4: pick one")],
)
def test_a_profile_that_cannot_say_needs_workers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    workers: tuple[int, ...] | None,
    why: str,
) -> None:
    assert main(["--size", "4K", "--profile", _saved(tmp_path, workers)]) == 2
    out, err = capsys.readouterr()
    assert not out
    assert err == (
        "inalab decide: error: give --workers (or a --topology with a job): the profile"
        f" cannot say ({why})\n"
    )
    # Without a record there is nothing to warn about.
    assert main(["--size", "4K", "--workers", "8", "--profile", _saved(tmp_path, None)]) == 0
    assert capsys.readouterr().err == ""
