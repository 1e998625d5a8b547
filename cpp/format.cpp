// Placeholder while this file is being written; replaced before any commit that claims the feature.
#include "format.hpp"
