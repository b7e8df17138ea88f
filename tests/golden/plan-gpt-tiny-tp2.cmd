$MESHC --dump=plan --set mesh.tp=2 examples/gpt-tiny.mesh
