$MESHC --memory-limit 4GiB examples/gpt2.mesh
