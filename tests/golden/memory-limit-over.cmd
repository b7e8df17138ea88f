$MESHC --memory-limit 3GiB examples/gpt2.mesh
