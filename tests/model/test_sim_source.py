"""The rewrites of the generated Verilog that the simulators compile (tb/runner.py,
``sim_source``) change no value: a small module in Yosys's style, with each construct
they rewrite, gives the same outputs for the same inputs under Icarus before and after.
"""
import random
import re
import shutil
import subprocess

import pytest

from tb.runner import compact_zero_init, icarus_kick, icarus_parity, icarus_single_drivers

# What Yosys writes for Amaranth: a memory zeroed word by word, parities over bit
# selects (one with a bit selected twice, one over two vectors), a wire driven in
# pieces (one piece a concatenation, one a constant, one expression), an escaped name.
MODULE = r"""
module dut(clk, d, e, p, q, w, m);
  input clk;
  wire clk;
  input [15:0] d;
  wire [15:0] d;
  input [7:0] e;
  wire [7:0] e;
  output [2:0] p;
  wire [2:0] p;
  output [23:0] q;
  wire [23:0] q;
  output [7:0] w;
  wire [7:0] w;
  output [3:0] m;
  wire [3:0] m;
  wire \$7 ;
  wire [23:0] \$9 ;
  reg [3:0] mem [3:0];
  initial begin
    mem[0] = 4'h0;
    mem[1] = 4'h0;
    mem[2] = 4'h0;
    mem[3] = 4'h0;
  end
  always @(posedge clk) mem[d[1:0]] <= d[7:4];
  assign m = mem[e[1:0]];
  assign \$7  = ^ { d[3], d[15:12], d[0] };
  assign p[0] = \$7 ;
  assign p[1] = ^ { d[5], e[7:2], d[5], d[9] };
  assign p[2] = ^ { e[0], d[11:1] };
  assign { \$9 [23:16], \$9 [7:4] } = { d[15:8], e[3:0] };
  assign \$9 [15:8] = 8'ha5;
  assign \$9 [3:0] = d[3:0] ^ e[7:4];
  assign q = \$9 ;
  assign { w[7:4], w[1:0] } = { e[7:4], d[1:0] };
  assign w[3:2] = 2'h2;
endmodule
"""

BENCH = """
module bench;
  reg clk = 0;
  reg [15:0] d = 0;
  reg [7:0] e = 0;
  wire [2:0] p;
  wire [23:0] q;
  wire [7:0] w;
  wire [3:0] m;
  dut u(.clk(clk), .d(d), .e(e), .p(p), .q(q), .w(w), .m(m));
  initial begin
    #2;
{steps}
    $finish;
  end
endmodule
"""


def rewritten(text):
    return icarus_kick(icarus_parity(icarus_single_drivers(compact_zero_init(text))))


def run_icarus(tmp_path, name, text, steps):
    src = tmp_path / f"{name}.v"
    src.write_text(text + BENCH.replace("{steps}", steps))
    subprocess.run(["iverilog", "-o", str(tmp_path / name), str(src)], check=True, capture_output=True, text=True)
    return subprocess.run(["vvp", "-n", str(tmp_path / name)], check=True, capture_output=True,
                          text=True).stdout.splitlines()


def test_rewrites_touch_what_they_should():
    new = rewritten(MODULE)
    assert "mem[1] = 4'h0" not in new and "for (i = 0; i < 4; i = i + 1) mem[i] = 4'h0;" in new
    assert "^ {" not in new                    # every parity over bit selects moved
    assert re.search(r"\\\$7  = \^ \(d & 16'h[0-9a-f]+\);", new)
    # d[5] twice cancels: p[1] is the parity of e[7:2] and d[9] only
    assert "p[1]" in MODULE and "^ (d & 16'h200) ^ ^ (e & 8'hfc)" in new
    assert re.search(r"assign \\\$9  = \{ icarus_piece_\d+\[11:4\]", new)
    assert new.count("assign w = {") == 1


def test_rewrites_change_no_value(tmp_path):
    if not shutil.which("iverilog"):
        pytest.fail("Icarus Verilog (iverilog) is not installed: run `make setup`")
    rng = random.Random(14)
    steps = []
    for _ in range(200):
        steps.append(f"    d = 16'h{rng.getrandbits(16):04x}; e = 8'h{rng.getrandbits(8):02x}; #1; clk = 1; #1; clk = 0; #1;\n"
                     '    $display("%b %h %h %h", p, q, w, m);')
    steps = "\n".join(steps)
    before = run_icarus(tmp_path, "before", MODULE, steps)
    after = run_icarus(tmp_path, "after", rewritten(MODULE), steps)
    assert len(before) == 200 and "x" not in "".join(before).lower()
    assert after == before
