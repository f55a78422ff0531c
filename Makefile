# rmqstore: `make demo` and `make test` set everything up themselves (virtualenv, install,
# Java check). Long runs (benchmarks) have their own targets.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: all venv java-check test test-long test-fast fuzz-native lint format demo man bench bench-quick campaigns clean

all: test

# The install builds the compiled record kernel (rmqstore/kernel/_native.pyx, Cython);
# RMQSTORE_REQUIRE_NATIVE makes a failed compile an error here instead of a quiet fallback.
$(STAMP): pyproject.toml setup.py rmqstore/kernel/_native.pyx
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "rmqstore needs Python 3.10+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	RMQSTORE_REQUIRE_NATIVE=1 $(BIN)/python -m pip install --quiet -e '.[test,spark]'
	@touch $(STAMP)

venv: $(STAMP)

# The Spark pipeline (and its tests) need Java 17 or newer on PATH or in JAVA_HOME.
java-check: venv
	@$(BIN)/python -m rmqstore.spark.javacheck

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The suite but the campaigns and the long tests (make test-long runs those) on the
# compiled kernel (required) and everything but Spark, the install tests (which build their
# own environments, the same either way), the real-time waits and the plumbing (a command's
# dealings with full and failing disks, descriptors, permissions, HA sockets, the terminal:
# no record kernel decides those) again on the pure-Python reference kernel: both paths stay
# green. The suite keeps both cores busy (its CPU time is about twice its wall time), so it
# runs as three streams at once: the compiled pass but for the Spark tests, the plumbing and
# the install tests; those (the Spark tests in one session); the reference pass. The other
# streams' output follows the first's. See the README's table of targets for how long it
# takes.
SPARK_LOG := $(VENV)/spark-stream.log
REFERENCE_LOG := $(VENV)/reference-pass.log
SPARK_MARKS := spark or plumbing or install
test: venv java-check lint
	@RMQSTORE_KERNEL=python $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "not ($(SPARK_MARKS) or timers or campaign or long)" \
	    >$(REFERENCE_LOG) 2>&1 & reference=$$!; \
	RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "($(SPARK_MARKS)) and not (campaign or long)" >$(SPARK_LOG) 2>&1 & spark=$$!; \
	echo "compiled kernel (two other streams run beside it):"; \
	RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q \
	    -m "not ($(SPARK_MARKS) or campaign or long)"; \
	compiled=$$?; \
	wait $$spark; sparked=$$?; wait $$reference; referenced=$$?; \
	echo "compiled kernel, $(SPARK_MARKS):"; cat $(SPARK_LOG); \
	echo "reference kernel:"; cat $(REFERENCE_LOG); \
	test $$compiled -eq 0 && test $$sparked -eq 0 && test $$referenced -eq 0

# What make test leaves out, on the compiled kernel: the short form of every adversarial
# campaign (make campaigns runs the long form: kills, power cuts, mutated stores, signals, a
# full disk, writers and readers side by side) and the tests of a minute or more each of a
# build or a JVM of its own (marked long): the kernel built with AddressSanitizer and
# UndefinedBehaviorSanitizer and a short fuzz pass (make fuzz-native runs the long one), a
# wheel built and installed into a fresh virtualenv, a JVM writing its class archive, a job
# on workers whose Python lacks rmqstore. Three streams at once (the campaigns; the builds;
# the JVMs), the others' output after the first's. CI runs it after make test.
BUILDS_LOG := $(VENV)/long-builds.log
JVMS_LOG := $(VENV)/long-jvms.log
test-long: venv java-check
	@RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "long and not spark" >$(BUILDS_LOG) 2>&1 & builds=$$!; \
	RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "long and spark" >$(JVMS_LOG) 2>&1 & jvms=$$!; \
	echo "campaigns, short form (two other streams run beside it):"; \
	RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q -p no:cacheprovider \
	    -m "campaign and not long"; \
	campaigned=$$?; wait $$builds; built=$$?; wait $$jvms; jvmed=$$?; \
	echo "long tests, builds:"; cat $(BUILDS_LOG); \
	echo "long tests, JVMs:"; cat $(JVMS_LOG); \
	test $$campaigned -eq 0 && test $$built -eq 0 && test $$jvmed -eq 0

# everything except the real-Spark tests and the long ones, on the compiled kernel
test-fast: venv lint
	RMQSTORE_KERNEL=native $(BIN)/python -m pytest -q -m "not spark and not long"

# the compiled kernel built with AddressSanitizer and UndefinedBehaviorSanitizer, fed
# 100,000 inputs (real-broker and fixture commit logs and mutations of them), each compared
# with the reference kernel; make test-long runs a short pass
fuzz-native: venv
	$(BIN)/python tests/kernel_fuzz.py --inputs $(or $(INPUTS),100000)

man: venv
	$(BIN)/python -m rmqstore.commands.manpages man

demo: venv java-check
	@DEMO_DIR="$(DEMO_DIR)" RMQSTORE="$(BIN)/rmqstore" PYTHON="$(BIN)/python" sh scripts/demo.sh

# The adversarial campaigns in their long form (300 kills during appends, 60 during recover
# and rebuild, 360 power cuts at their syncs, 300 mutated real stores x every command, 180
# whose verify next steps are followed to the end, 150 writers and 60 replicate runs stopped
# by a full disk, 150 s of writers and readers beside each other on one store); make
# test-long runs a short form of each.
# SEED=N kills and mutates elsewhere than the fixed default (a failure names its seed);
# FS=ext4 puts the full-disk campaign on ext4 (a loop device) instead of a tmpfs.
campaigns: venv
	RMQSTORE_CAMPAIGN=long RMQSTORE_CAMPAIGN_SEED=$(SEED) RMQSTORE_CAMPAIGN_FS=$(FS) \
	    $(BIN)/python -m pytest -q -p no:cacheprovider -m campaign

bench: venv java-check
	$(BIN)/python bench/run_all.py

bench-quick: venv java-check
	$(BIN)/python bench/run_all.py --messages 200000

clean:
	rm -rf $(VENV) $(DEMO_DIR) build *.egg-info .pytest_cache .ruff_cache
	rm -f rmqstore/kernel/_native.c rmqstore/kernel/_native.*.so
