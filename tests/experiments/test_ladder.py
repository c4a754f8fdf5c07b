"""The committed budget ladder (results/ladder: issue 57, item 7) is what the code prints from the committed rungs'
records: trend.md (ratios with their intervals, each claim's verdict on each rung) and trend.csv. Rewrite them with
`posenc --import experiments/accumulated/claims.py report results/default results/ladder/steps-800
results/ladder/steps-3200 --trend train.steps --out results/ladder`."""

from pathlib import Path

from posenc.reports.trend import write_trend_report

ROOT = Path(__file__).resolve().parents[2]
LADDER = ROOT / "results" / "ladder"


def test_the_committed_trend_is_what_the_code_prints_from_the_rungs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the report names each rung by the path it was given
    rungs = [Path("results/default"), Path("results/ladder/steps-800"), Path("results/ladder/steps-3200")]
    write_trend_report(rungs, tmp_path, "train.steps")
    for name in ("trend.md", "trend.csv"):
        assert (tmp_path / name).read_text() == (LADDER / name).read_text(), name
    assert "| (iii) rotating Q/K/V" in (LADDER / "trend.md").read_text()  # the claims table: the study's set loaded
