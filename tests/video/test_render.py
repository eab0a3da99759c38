"""python -m video.render: the documented clip script, with and without Step Rehash."""
import pytest
from PIL import Image

from video.render import main


@pytest.mark.parametrize("extra", [[], ["--rehash", "100"]])
def test_render_writes_a_gif(tmp_path, capsys, extra):
    out = tmp_path / "clip.gif"
    main(["--frames", "4", "--size", "8", "--steps", "4", "--slices", "2", "--out", str(out), *extra])
    with Image.open(out) as gif:
        assert gif.n_frames == 4 and gif.size == (16, 16)
    printed = capsys.readouterr().out
    if extra:  # threshold 100 rehashes every step past the 2 warm-up steps, at most 2 in a row
        assert "2 of 4 steps rehashed" in printed
    else:
        assert "rehashed" not in printed


def test_render_rejects_a_negative_threshold(tmp_path):
    with pytest.raises(SystemExit, match="threshold must be >= 0"):
        main(["--rehash", "-1", "--out", str(tmp_path / "c.gif")])
    assert not (tmp_path / "c.gif").exists()
