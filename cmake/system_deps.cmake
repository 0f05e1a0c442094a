# Debian-packaged libraries every skippy build links (the main build and fuzz/):
# threads, libcrypto (SHA-256 for prefix identities) and libxxhash (block hashes).
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(skippy_xxhash INTERFACE)
target_include_directories(skippy_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(skippy_xxhash INTERFACE ${XXHASH_LIBRARY})
