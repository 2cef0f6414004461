// Trains one step of a tiny model through the installed headers and library.
#include <accrue.h>

#include <iostream>

int main() {
  using namespace accrue;
  nn::Linear layer(3, 2);
  optim::ParameterArena arena(layer);
  optim::SGD sgd(arena, {});
  Tensor x = full({4, 3}, 0.5);
  Tensor y = Tensor::from_vector<int32_t>({4}, {0, 1, 1, 0});
  backward(cross_entropy(layer(x), y), 0.25);
  sgd.step();
  std::cout << "consumer ok: " << arena.size() << " arena elements\n";
  return 0;
}
