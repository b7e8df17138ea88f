$MESHC -I tests/golden/snippets --set model.dim=48 examples/gpt-tiny.mesh
