$MESHC --dump=memory --set mesh.tp=2 examples/gpt-tiny.mesh
