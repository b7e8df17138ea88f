$MESHC --check --memory-limit 3GiB --set train.recompute=full examples/gpt2.mesh
