python3 tests/gpu/report.py tests/gpu/report/rehearsal/gpu.json
