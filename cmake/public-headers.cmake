# The public headers: the API a program built against an installed accrue includes (accrue.h
# includes them all), and every header they include, so that each compiles on its own. Only
# these are installed; the rest (the kernels' math and dispatch, the CUDA seams, the engine's
# parts) is internal. tests/consumer compiles each installed header alone.
set(ACCRUE_PUBLIC_HEADERS
  accrue.h
  core/allocator.h core/device.h core/dtype.h core/error.h core/file.h core/geometry.h
  core/graph.h core/half.h core/host_waits.h core/staging.h core/tensor.h core/threads.h
  distributed/communicator.h distributed/data_parallel.h distributed/pipeline.h
  distributed/counting.h distributed/zero.h
  kernels/backend.h kernels/factories.h kernels/op_kinds.h
  nn/activation.h nn/conv.h nn/init.h nn/linear.h nn/loss.h nn/mlp.h nn/module.h nn/norm.h
  nn/sequential.h nn/transformer.h
  ops/autograd.h ops/ops.h
  optim/accumulator.h optim/adam.h optim/arena.h optim/offload.h optim/optimizer.h
  optim/registry.h optim/safetensors.h optim/schedule.h optim/seams.h optim/sgd.h
  optim/window.h
  train/config.h train/engine.h train/flags.h train/run.h train/step_graphs.h train/strategy.h
  train/task.h)
