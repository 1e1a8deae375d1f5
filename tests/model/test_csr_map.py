"""The CSR map of docs/interfaces.md is spec/csr.py's, row for row; the RTL holds its widths."""
from pathlib import Path

from amaranth.hdl import Fragment

from spec import csr
from spec.params import NUM_CQS, NUM_QPS, PD_BITS

DOC = Path(__file__).resolve().parents[2] / "docs" / "interfaces.md"


def doc_rows(text=None):
    """The rows ``(addr, name, access, bits, meaning)`` of the document's "CSR map" table."""
    text = DOC.read_text() if text is None else text
    section = text.split("## CSR map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or cells[0] in ("addr", "---"):
            continue
        assert len(cells) == 5, line
        addr, name, access, bits, meaning = cells
        rows.append((int(addr, 16), name, access, 0 if bits == "-" else int(bits), meaning))
    return rows


def spec_rows():
    return [(r.addr, r.name, r.access, r.width, r.meaning) for r in csr.ALL]


def test_doc_table_is_spec():
    doc, spec = doc_rows(), spec_rows()
    assert [r[:4] for r in doc] == [r[:4] for r in spec]
    assert doc == spec


def test_a_changed_address_is_caught():
    text = DOC.read_text()
    for old, new in (("| 0x0B4 | acks_sent |", "| 0x0B8 | acks_sent |"), ("| 0x130 | QP_COMMIT |", "| 0x134 | QP_COMMIT |")):
        assert old in text
        assert doc_rows(text.replace(old, new)) != spec_rows()


def test_counters():
    assert [c.addr for c in csr.COUNTERS] == sorted(c.addr for c in csr.COUNTERS)
    assert csr.COUNTER_NAMES[:6] == ("doorbells", "doorbells_dropped", "wqes", "packets", "cqes", "error_cqes")
    assert all(csr.reg(n).access == csr.RO and csr.reg(n).width == 32 for n in csr.COUNTER_NAMES)


def test_rtl_widths():
    from rtl.host.control_registers import ControlRegisters
    dut = ControlRegisters(num_qps=NUM_QPS, num_cqs=NUM_CQS, pd_bits=PD_BITS)
    Fragment.get(dut, None)             # elaborates: the decoder checks it covers the map
    assert dut.widths == {r.name: r.width for r in csr.REGISTERS if r.access == csr.RW}
