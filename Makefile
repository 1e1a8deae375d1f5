# ibgda-nic: set-up, regression, simulation and generated-Verilog targets.
# `make setup` then `make test` is all a fresh Debian 12 machine (as root) needs.

PY      := .venv/bin/python
JOBS    ?= 2
SIM     ?=
TEST    ?=
# Warning classes that only describe how Yosys writes Verilog (intermediate widths of
# its arithmetic, initialised regs it assigns in processes, cases over FSM encodings,
# per-module file names, unused helper nets); every other -Wall warning fails `make lint`.
LINT_WAIVE := -Wno-WIDTHEXPAND -Wno-WIDTHTRUNC -Wno-PROCASSINIT -Wno-CASEINCOMPLETE -Wno-VARHIDDEN \
              -Wno-DECLFILENAME -Wno-UNUSEDSIGNAL -Wno-UNUSEDPARAM

.PHONY: help setup test test-fast sim waves profile bench seeds interop faults fuzz verilog lint synth timing clean

help:
	@echo "make setup     install everything (Debian packages, Verilator >= 5.036, .venv)"
	@echo "make test      full regression on Icarus and Verilator"
	@echo "make sim       default end-to-end scenario (SIM=icarus|verilator), summary + build/sim/wire.pcap"
	@echo "make waves     the same (or TEST=<cocotb test>) with FST waveforms"
	@echo "make profile   the default scenario profiled: where the wall time goes (simulator, interface, each model)"
	@echo "make bench     throughput and latency figures of the engine"
	@echo "make seeds     IBGDA against IBRC on the RTL: the published table rerun (QUICK=1 a subset,"
	@echo "               SCHEDULER=tcp://host:8786 a Dask cluster), build/seeds/"
	@echo "make interop   the engine against Linux's Soft-RoCE (rxe) in a qemu guest, build/interop/wire.pcap"
	@echo "make faults    the fault matrix (every fault kind at 0.1/1/5%, two engines and the golden peer)"
	@echo "               on Icarus and Verilator (SIM=icarus|verilator: one), about an hour"
	@echo "make fuzz      100,000 bad inputs or more against the golden model (SEED=n, N=count)"
	@echo "make verilog   generated Verilog in build/verilog/"
	@echo "make lint      verilator --lint-only on the generated Verilog"
	@echo "make synth     Yosys synthesis: cells, flip-flop and RAM bits per block (QPS=n: another QP count)"
	@echo "make timing    logic depth per block and of the engine: LUT6 and gate levels (build/timing/report.json)"

setup:
	bash scripts/setup.sh

$(PY):
	@echo "the Python environment is missing: run 'make setup' first" >&2; exit 1

test: $(PY)
	$(PY) -m pytest -n $(JOBS) --maxschedchunk=1 -p no:cacheprovider --durations=12 tests

sim: $(PY)
	$(PY) -m scripts.run_sim $(if $(SIM),--sim $(SIM))

profile: $(PY)
	$(PY) -m scripts.run_profile $(if $(SIM),--sim $(SIM)) $(if $(WHAT),--what $(WHAT))

waves: $(PY)
	$(PY) -m scripts.run_sim --waves $(if $(SIM),--sim $(SIM)) $(if $(TEST),--test $(TEST))

synth: $(PY)
	$(PY) -m scripts.run_synth $(if $(QPS),--qps $(QPS))

timing: $(PY)
	$(PY) -m scripts.run_timing --jobs $(JOBS)

fuzz: $(PY)
	$(PY) -m scripts.run_fuzz $(if $(SEED),--seed $(SEED)) $(if $(N),--n $(N))

bench: $(PY)
	$(PY) -m scripts.run_bench --jobs $(JOBS) $(if $(SIM),--sim $(SIM)) $(if $(SCHEDULER),--scheduler $(SCHEDULER))

seeds: $(PY)
	$(PY) -m scripts.run_seeds --jobs $(JOBS) $(if $(SCHEDULER),--scheduler $(SCHEDULER))

faults: $(PY)
	IBGDA_FAULT_SIMS="$(if $(SIM),$(SIM),icarus verilator)" $(PY) -m pytest -n $(JOBS) --maxschedchunk=1 \
	    -p no:cacheprovider --durations=12 tests/system/test_pair.py::test_pair_faults \
	    tests/system/test_two_sided.py::test_two_sided_faults

interop: $(PY)
	$(PY) -m scripts.run_interop

verilog: $(PY)
	$(PY) -m rtl.build build/verilog

lint: verilog
	$(PY) -m scripts.verilator -- --lint-only -Wall $(LINT_WAIVE) scripts/lint.vlt build/verilog/ibgda_nic.v --top-module ibgda_nic
	@echo "lint: clean"

clean:
	rm -rf build sim_build results.xml
