// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: PinnedBuffer::as<T>() with a non-trivial T (its objects would be used
// without ever being constructed). The diagnostic must say why (checked by
// expect_compile_error.sh).
#include <string>

#include "devstage/pinned.hpp"

int main() {
    devstage::PinnedBuffer buffer;
    return static_cast<int>(buffer.as<std::string>().size());
}
