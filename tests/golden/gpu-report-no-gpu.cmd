python3 tests/gpu/report.py tests/gpu/report/no-gpu.json
