// Runtime identity for the prefix cache: llama.cpp pin + state format, part of every
// prefix identity so states from another runtime build are never reused.
#pragma once

#include <string>

namespace skippy::runtime {
std::string runtime_version();
}
