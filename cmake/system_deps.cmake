# Debian-packaged libraries every skippy build links (the main build and fuzz/):
# threads, libcrypto (SHA-256 for prefix identities), libxxhash (block hashes), hiredis
# (the Redis tier), libzmq + cppzmq (KV events) and msgpack-c (their payloads).
find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(skippy_xxhash INTERFACE)
target_include_directories(skippy_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(skippy_xxhash INTERFACE ${XXHASH_LIBRARY})
find_package(PkgConfig REQUIRED)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
pkg_check_modules(MSGPACKC REQUIRED IMPORTED_TARGET msgpack)
