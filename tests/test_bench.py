"""No-GPU layer: the benchmark's table and the CLI's refusal without a GPU."""
import pytest

from conftest import GPU
from qrgen.bench import Timing, table
from qrgen.cli import main


def test_table_columns_and_ratios():
    text = table([Timing(20, 32, 32, 100.0, 300.0, 0.1, 0.2, True, 103.0),
                  Timing(2, 4096, 1024, 5e4, None, 0.0, 0.0, False)])
    lines = text.splitlines()
    assert lines[0].startswith("| batch x shape | qrgen µs | mixed batch µs | torch.geqrf µs | speed-up")
    assert "| 20 x 32² | 100.0 | 103.0 (+3%) | 300 | 3.0x |" in lines[2]
    assert "| 2 x 4096x1024 |" in lines[3] and lines[3].endswith("| FAIL |")


def test_table_graph_column():
    text = table([Timing(20, 32, 32, 100.0, 300.0, 0.1, 0.2, True, None, 12.5),
                  Timing(8, 64, 64, 50.0, 90.0, 0.1, 0.2, True, None, None)])
    lines = text.splitlines()
    assert lines[0].startswith("| batch x shape | qrgen µs | graph replay µs | torch.geqrf µs |")
    assert lines[2].startswith("| 20 x 32² | 100.0 | 12.5 | 300 |")
    assert lines[3].startswith("| 8 x 64² | 50.0 | — |")


@pytest.mark.skipif(GPU, reason="checks the refusal where there is no GPU")
def test_bench_refuses_without_gpu(capsys):
    assert main(["bench", "2x64x64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
