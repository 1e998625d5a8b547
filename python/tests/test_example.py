"""examples/python/score_package.py runs and reports the package's own numbers."""

import subprocess
import sys

from conftest import DEMO_TEXT, REPO, TINY_MODEL


def test_score_package_example(tiny):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "python" / "score_package.py"), str(TINY_MODEL),
                           str(DEMO_TEXT), "--device", "cpu"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = tiny.score(DEMO_TEXT.read_bytes())
    assert f"perplexity {expected.perplexity:.4f} over {expected.tokens_scored} tokens" in done.stdout
    assert "expected error: TL_ERR_IO: cannot open '/nonexistent/model.tinyloop'" in done.stdout
