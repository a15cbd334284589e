"The landing page's figures and the numbers it quotes come from committed results: drawing them again changes nothing."
import json
from conftest import ROOT
import gap_closed, grid_figure

def test_the_grid_figure_is_drawn_from_the_committed_grid():
    rows = grid_figure.bars(json.loads(grid_figure.RESULTS.read_text()))
    assert grid_figure.svg(rows) == grid_figure.OUT.read_text(), 'run python scripts/grid_figure.py'
    assert [r['key'] for r in rows] == ['teacher', 'naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+']

def test_the_gap_closed_numbers_and_figure_are_computed_from_the_committed_results():
    res, figure = gap_closed.compute()
    committed = json.loads(gap_closed.OUT_JSON.read_text())
    assert {k: v for k, v in res.items() if k != 'paper_check'} == {k: v for k, v in committed.items() if k != 'paper_check'}, \
        'run python scripts/gap_closed.py'
    assert figure == gap_closed.OUT_SVG.read_text()

def test_gap_closed_is_the_share_of_the_log_gap():
    assert gap_closed.closed(100.0, 100.0, 10.0) == 0 and gap_closed.closed(100.0, 10.0, 10.0) == 1
    assert abs(gap_closed.closed(100.0, 31.622776601683793, 10.0) - 0.5) < 1e-12   # halfway in log space
