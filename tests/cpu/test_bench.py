"""CPU layer: the benchmark's table, its work floors of a launch sequence, its case sets, and the CLI's refusal
without a GPU."""
import pytest

from conftest import GPU
from qrgen.bench import (CEILING_BYTES, CEILING_FLOPS, QR_CASES, REFERENCE_CASES, SINGLE_TALL_CASES, SMALL_CASES,
                         UNTUNED_CASES, Timing, case_sets, floors_text, gemm_flops, stage_work, table)
from qrgen.cli import main
from qrgen.problem import Problem
from qrgen.run.factorizer import Factorizer
from qrgen.schedule.files import find, lookup
from qrgen.schedule.model import Panel, Schedule
from qrgen.targets import Target


def test_table_columns_and_ratios():
    text = table([Timing(20, 32, 32, 100.0, 300.0, 0.1, 0.2, True, hostile=(("mixed", 103.0), ("rankdef", 98.0))),
                  Timing(2, 4096, 1024, 5e4, None, 0.0, 0.0, False, hostile=(("rankdef", 5.1e4),))])
    lines = text.splitlines()
    assert lines[0].startswith("| batch x shape | qrgen µs | mixed batch µs | rankdef batch µs | torch.geqrf µs | "
                               "speed-up")
    assert "| 20 x 32² | 100.0 | 103.0 (+3%) | 98.0 (-2%) | 300 | 3.0x |" in lines[2]
    assert "| 2 x 4096x1024 | 50,000.0 | — | 51,000.0 (+2%) |" in lines[3] and lines[3].endswith("| FAIL |")


def test_table_graph_column():
    text = table([Timing(20, 32, 32, 100.0, 300.0, 0.1, 0.2, True, 12.5),
                  Timing(8, 64, 64, 50.0, 90.0, 0.1, 0.2, True, None)])
    lines = text.splitlines()
    assert lines[0].startswith("| batch x shape | qrgen µs | graph replay µs | torch.geqrf µs |")
    assert lines[2].startswith("| 20 x 32² | 100.0 | 12.5 | 300 |")
    assert lines[3].startswith("| 8 x 64² | 50.0 | — |")


def test_floors_of_one_panel_by_hand():
    # 3 matrices of 32 x 32 on one lanes panel: Householder on 32 columns, nothing else
    fac = Factorizer(32, 32, Schedule(32, 32, (Panel(32, "lanes", 32),)), Target("cuda", "sm_90"))
    (panels,) = stage_work(fac, 3)
    assert panels.stage == "panels"
    assert panels.flops == 3 * sum(4 * (32 - j) ** 2 for j in range(32))
    assert panels.bytes == 3 * 4 * 2 * 32 * 32  # read and written once
    assert panels.arithmetic_us == pytest.approx(1e6 * panels.flops / CEILING_FLOPS["fp32"])
    assert panels.memory_us == pytest.approx(1e6 * panels.bytes / CEILING_BYTES)


@pytest.mark.parametrize("batch,m,n", [(60, 1024, 1024), (8, 2048, 2048), (2, 4096, 4096), (1, 40000, 256)])
def test_floors_account_for_the_factorization(batch, m, n):
    # The stages' operations cover Householder QR's 2mn² - 2n³/3 (the blocked form adds the trapezoids' zeros, G
    # and V T), each precision the schedule names is counted, and the products' share matches gemm_flops.
    target = Target("cuda", "sm_90")
    schedule, _ = find(Problem(m, n, batch), target)
    fac = Factorizer(m, n, schedule, target)
    work = {w.stage: w for w in stage_work(fac, batch)}
    total = sum(w.flops for w in work.values())
    assert batch * (2 * m * n * n - 2 * n ** 3 / 3) <= total <= 1.7 * batch * (2 * m * n * n - 2 * n ** 3 / 3)
    prec = schedule.precision
    assert {prec.project, prec.update} <= {p for p, _ in work["aggregates' products"].flops_by}
    # (a schedule whose panels are each their own aggregate has no products of its own: 60 x 1024²)
    products = ("own products", "aggregates' products")
    assert gemm_flops(fac, batch) == sum(work[s].flops for s in products if s in work)
    # the matrices are read and written at least once
    assert sum(w.bytes for w in work.values()) >= 2 * 4 * batch * m * n
    text = floors_text(fac, batch)
    assert f"panels: {n} columns one after another" in text and "aggregates' products" in text


@pytest.mark.skipif(GPU, reason="checks the refusal where there is no GPU")
def test_bench_refuses_without_gpu(capsys):
    assert main(["bench", "2x64x64"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_case_sets():
    """The cases given, then the sets asked for, each case once; with neither, the reference batches (qr's own
    defaults with --qr)."""
    assert case_sets() == REFERENCE_CASES
    assert case_sets(qr=True) == QR_CASES
    assert case_sets(qr=True, tall=True) == SINGLE_TALL_CASES
    assert case_sets(tall=True) == SINGLE_TALL_CASES
    given = ((1, 20000, 100), SINGLE_TALL_CASES[0])
    assert case_sets(tall=True, cases=given) == given[:1] + SINGLE_TALL_CASES
    assert case_sets(qr=True, cases=given) == case_sets(cases=given) == given
    both = case_sets(small=True, untuned=True)
    assert both[:len(SMALL_CASES)] == SMALL_CASES
    assert len(both) == len(set(SMALL_CASES + UNTUNED_CASES)) and (500, 128, 128) in both  # in both sets, once


@pytest.mark.parametrize("batch,m,n", UNTUNED_CASES)
def test_untuned_cases_have_no_schedule_file(batch, m, n):
    assert lookup(Problem(m, n, batch), Target("cuda", "sm_90")) is None
