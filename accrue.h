// The whole public API of accrue in one include: #include <accrue.h>.
#pragma once

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/device.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "nn/activation.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "optim/adam.h"
#include "optim/arena.h"
#include "optim/sgd.h"
