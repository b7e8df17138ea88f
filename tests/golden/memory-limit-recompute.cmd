$MESHC --check --memory-limit 4GiB --set train.recompute=full examples/gpt2.mesh
