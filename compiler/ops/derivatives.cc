#include "compiler/ops/registry.h"
namespace kiln::ops { void RegisterDerivatives(Registry*) {} }
