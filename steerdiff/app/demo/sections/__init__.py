"""Demo sections: every module here registers one or more experiments with :func:`steerdiff.app.demo.registry.section`.

Modules are imported in name order; the report orders sections by their ``order``. A module that imports a
``steerdiff`` module which does not exist (a method not landed yet) is reported as not available.
"""
