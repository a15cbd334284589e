"README.md is generated from nbs/index.ipynb (scripts/build_docs.py readme) and must stay in sync."
from conftest import ROOT
import build_docs

def test_readme_in_sync():
    assert (ROOT/'README.md').read_text(encoding='utf-8') == build_docs.readme_text(), \
        'README.md is out of date: run python scripts/build_docs.py readme'

def test_readme_names_the_two_commands():
    txt = (ROOT/'README.md').read_text()
    assert 'pip install -e . && taylor-calibrate demo' in txt
    ci = (ROOT/'.ci'/'run').read_text()
    cmd = 'pip install -e ".[dev]" && nbdev_test && pytest tests/'
    assert cmd in txt and cmd in ci, 'README and .ci/run must run the same test command'
