"A miniature run of scripts/experiments.py (every part, a few steps each) keeps the experiment code path tested."
import json, subprocess, sys
from pathlib import Path
from conftest import ROOT

def test_experiments_mini(tmp_path):
    out = tmp_path/'exp.json'
    r = subprocess.run([sys.executable, str(ROOT/'scripts'/'experiments.py'), '--mini', '--threads', '1', '--out', str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert {'grid', 'retention', 'gqa', 'recovery'} <= set(res)
    assert all(v['mean'] > 1 for v in res['grid'].values())
    assert set(res['recovery']['logs']) == {'naive', 'zero_gate', 'taylor', 'taylor+'}
