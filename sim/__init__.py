# Hot modules here may be compiled (agentsim/compiled.py): a build is imported only while it
# matches its .py.
from agentsim.compiled import install

install()
