"The shipped corpus: disjoint document-level splits, and a build script that reproduces the files byte for byte."
import gzip, hashlib, json, shutil, subprocess
import pytest
from conftest import ROOT
import build_corpus

CORPUS = ROOT/'taylor_calibrate'/'data'/'corpus'

def docs(split):
    with gzip.open(CORPUS/f'{split}.jsonl.gz', 'rt') as f: return [json.loads(l) for l in f]

def test_splits_disjoint_and_follow_the_hash():
    seen = {}
    for split in ('train', 'valid', 'test'):
        for d in docs(split):
            assert d['path'] not in seen, f"{d['path']} in {seen[d['path']]} and {split}"
            assert build_corpus.split_of(d['path']) == split
            seen[d['path']] = split
    texts = [d['text'] for s in ('train', 'valid', 'test') for d in docs(s)]
    assert len(set(texts)) == len(texts), 'the same document text appears twice'

@pytest.mark.skipif(shutil.which('apt-get') is None or shutil.which('dpkg') is None, reason='needs apt-get and dpkg (Debian)')
def test_build_reproduces_shipped_files(tmp_path, monkeypatch):
    r = subprocess.run(['apt-get', 'download', 'python3.11-doc'], cwd=tmp_path, capture_output=True)
    debs = list(tmp_path.glob('python3.11-doc_*.deb'))
    if r.returncode or not debs: pytest.skip(f'apt-get download failed: {r.stderr.decode()[-200:]}')
    if debs[0].name != build_corpus.EXPECTED_DEB: pytest.skip(f'Debian now serves {debs[0].name}, not {build_corpus.EXPECTED_DEB}')
    monkeypatch.setattr(build_corpus, 'OUT', tmp_path/'out')
    build_corpus.main(str(debs[0]))
    for fn in CORPUS.iterdir():
        assert hashlib.sha256(fn.read_bytes()).digest() == hashlib.sha256((tmp_path/'out'/fn.name).read_bytes()).digest(), fn.name
