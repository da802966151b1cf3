# cmake -DDIR=<folder> -P fresh_dir.cmake: the folder, emptied (the fuzz tests' work folders, so
# that each bounded run starts from the checked-in corpus alone: the same inputs and time on every
# run, not a corpus that grows with each one).
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
