"""kiln.capture() and kiln.signature(): the graphs they build, without a server."""

import glob
import os
import re
import sys
import unittest

import torch
import torch.nn.functional as F
from google.protobuf import json_format

import kiln
from kiln.v1 import graph_pb2, service_pb2

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data")
GRAPHS_DIR = os.path.join(DATA_DIR, "graphs")
sys.path.insert(0, DATA_DIR)
import capture_graphs  # noqa: E402

TARGET = re.compile(r"^aten\.[a-z0-9_]+\.[A-Za-z0-9_]+$")


def multi_output_ops(x):
    """Ops with several results: split_with_sizes, var_mean, max_pool2d_with_indices."""
    a, b = torch.split(x, [3, 5], dim=1)
    var, mean = torch.var_mean(x, dim=1)
    pooled, indices = F.max_pool2d(x.view(1, 4, 2, 4), 2, return_indices=True)
    return a * 2, b, var + mean, pooled, indices


def check_graph(test, graph):
    """Every value is defined once, before use, and carries full metadata;
    every target is an ATen overload."""
    defined = set()

    def check_value(value, where):
        test.assertTrue(value.name, where)
        test.assertNotIn(value.name, defined, f"{where}: '{value.name}' defined twice")
        defined.add(value.name)
        meta = value.meta
        test.assertTrue(value.HasField("meta"), f"{where} '{value.name}' has no meta")
        test.assertNotEqual(meta.dtype, graph_pb2.DTYPE_UNSPECIFIED, value.name)
        test.assertTrue(meta.HasField("device") and meta.device.type, value.name)
        test.assertEqual(len(meta.sizes), len(meta.strides), value.name)
        for s in list(meta.sizes) + list(meta.strides):
            test.assertEqual(s.WhichOneof("value"), "int_value", value.name)
        test.assertTrue(meta.HasField("storage_offset"), value.name)

    def check_argument(arg, where):
        kind = arg.WhichOneof("kind")
        test.assertIsNotNone(kind, f"{where}: argument without a value")
        if kind == "tensor":
            test.assertIn(arg.tensor, defined, f"{where}: '{arg.tensor}' used before defined")
        if kind == "tensors":
            for name in arg.tensors.names:
                test.assertIn(name, defined | {""}, where)

    for i, ph in enumerate(graph.inputs):
        test.assertNotEqual(ph.kind, graph_pb2.Placeholder.KIND_UNSPECIFIED)
        check_value(ph.value, f"input {i}")
    node_names = set()
    for node in graph.nodes:
        test.assertRegex(node.target, TARGET)
        test.assertNotIn(node.name, node_names)
        node_names.add(node.name)
        for arg in node.args:
            test.assertEqual(arg.name, "", f"node '{node.name}': positional argument with a name")
            check_argument(arg, f"node '{node.name}'")
        for arg in node.kwargs:
            test.assertTrue(arg.name, f"node '{node.name}': keyword argument without a name")
            check_argument(arg, f"node '{node.name}'")
        test.assertGreater(len(node.outputs), 0, node.name)
        for out in node.outputs:
            check_value(out, f"node '{node.name}' output")
    test.assertGreater(len(graph.outputs), 0)
    for name in graph.outputs:
        test.assertIn(name, defined)


class CaptureTest(unittest.TestCase):

    def test_graphs_are_complete(self):
        for file_name, graph in capture_graphs.graphs():
            with self.subTest(graph=file_name):
                check_graph(self, graph)

    def test_arguments_have_the_kinds_their_schemas_name(self):
        # A number where the schema wants a Tensor moves the call to the
        # overload that takes a Scalar: x + eps is aten.add.Scalar.
        for file_name, graph in capture_graphs.graphs():
            for node in graph.nodes:
                _, name, overload = node.target.split(".")
                schema = getattr(getattr(torch.ops.aten, name), overload)._schema
                for arg, param in zip(node.args, schema.arguments):
                    if str(param.type) == "Tensor":
                        self.assertEqual(arg.WhichOneof("kind"), "tensor",
                                         f"{file_name}: node '{node.name}' {param.name}")
        # The residual blocks add two tensors (aten.add.Tensor): leave them out.
        residual = ("resnet_block.json", "transformer_block.json")
        targets = [n.target for f, g in capture_graphs.graphs() if f not in residual
                   for n in g.nodes]
        self.assertIn("aten.add.Scalar", targets)
        self.assertIn("aten.div.Scalar", targets)
        self.assertNotIn("aten.add.Tensor", targets)

    def test_module_inputs_are_parameters_buffers_then_user_inputs(self):
        torch.manual_seed(0)
        block = capture_graphs.ConvBlock().eval()
        graph = kiln.capture(block, torch.randn(1, 3, 8, 8))
        self.assertEqual(graph.name, "ConvBlock")
        kinds = [(ph.value.name, graph_pb2.Placeholder.Kind.Name(ph.kind)) for ph in graph.inputs]
        self.assertEqual(kinds, [
            ("conv_weight", "PARAMETER"), ("conv_bias", "PARAMETER"),
            ("bn_weight", "PARAMETER"), ("bn_bias", "PARAMETER"),
            ("bn_running_mean", "BUFFER"), ("bn_running_var", "BUFFER"),
            ("bn_num_batches_tracked", "BUFFER"), ("x", "USER_INPUT"),
        ])
        self.assertEqual(len(kiln.module_tensors(block)) + 1, len(graph.inputs))
        self.assertTrue(graph.inputs[0].value.meta.requires_grad)
        self.assertFalse(graph.inputs[-1].value.meta.requires_grad)
        self.assertEqual(graph.inputs[6].value.meta.dtype, graph_pb2.INT64)

    def test_targets_spell_aten_overloads(self):
        graph = kiln.capture(capture_graphs.MLP(), torch.randn(4, 32))
        self.assertEqual(graph.name, "MLP")
        targets = [n.target for n in graph.nodes]
        self.assertIn("aten.addmm.default", targets)
        self.assertIn("aten.native_layer_norm.default", targets)
        self.assertIn("aten.gelu.default", targets)
        # aten.t is decomposed into core ATen.
        self.assertNotIn("aten.t.default", targets)

    def test_multi_output_ops_are_one_node(self):
        graph = kiln.capture(multi_output_ops, torch.randn(4, 8))
        check_graph(self, graph)
        self.assertEqual(graph.name, "multi_output_ops")
        by_target = {n.target: n for n in graph.nodes}
        self.assertNotIn("getitem", " ".join(by_target))
        self.assertEqual(len(by_target["aten.split_with_sizes.default"].outputs), 2)
        self.assertEqual(len(by_target["aten.var_mean.correction"].outputs), 2)
        pool = by_target["aten.max_pool2d_with_indices.default"]
        self.assertEqual(len(pool.outputs), 2)
        self.assertEqual(pool.outputs[1].meta.dtype, graph_pb2.INT64)
        self.assertEqual([s.int_value for s in pool.outputs[0].meta.sizes], [1, 4, 1, 2])
        self.assertEqual(len(graph.outputs), 5)
        # The second split output is returned as is: a graph output names it.
        split = by_target["aten.split_with_sizes.default"]
        self.assertEqual(graph.outputs[1], split.outputs[1].name)

    def test_unused_outputs_are_named_after_their_node(self):
        graph = kiln.capture(capture_graphs.MLP(), torch.randn(4, 32))
        ln = next(n for n in graph.nodes if n.target == "aten.native_layer_norm.default")
        self.assertEqual(len(ln.outputs), 3)
        self.assertEqual([o.name for o in ln.outputs[1:]],
                         [f"{ln.name}_out1", f"{ln.name}_out2"])
        self.assertEqual([s.int_value for s in ln.outputs[1].meta.sizes], [4, 1])

    def test_metadata_records_strides_and_offsets(self):
        def transposed(x):
            return x.t(), x[1:]

        graph = kiln.capture(transposed, torch.randn(3, 5))
        outputs = {o.name: o.meta for n in graph.nodes for o in n.outputs}
        t = outputs[graph.outputs[0]]
        self.assertEqual([s.int_value for s in t.sizes], [5, 3])
        self.assertEqual([s.int_value for s in t.strides], [1, 5])
        self.assertEqual(outputs[graph.outputs[1]].storage_offset.int_value, 5)
        self.assertEqual(t.device.type, "cpu")
        self.assertEqual(t.device.index, -1)

    def test_typed_arguments(self):
        def casts(x):
            return x.to(torch.float64).sum(dim=[0], keepdim=True), F.gelu(x, approximate="tanh")

        graph = kiln.capture(casts, torch.randn(2, 3))
        check_graph(self, graph)
        to_copy = next(n for n in graph.nodes if n.target == "aten._to_copy.default")
        self.assertEqual(to_copy.kwargs[0].name, "dtype")
        self.assertEqual(to_copy.kwargs[0].dtype, graph_pb2.FLOAT64)
        total = next(n for n in graph.nodes if n.target == "aten.sum.dim_IntList")
        self.assertEqual(list(total.args[1].ints.values), [0])
        self.assertTrue(total.args[2].bool_value)
        gelu = next(n for n in graph.nodes if n.target == "aten.gelu.default")
        self.assertEqual(gelu.kwargs[0].name, "approximate")
        self.assertEqual(gelu.kwargs[0].string_value, "tanh")

    def test_same_tensor_twice_gives_two_inputs(self):
        def add(a, b):
            return a + b

        x = torch.randn(4)
        graph = kiln.capture(add, x, x)
        self.assertEqual([ph.value.name for ph in graph.inputs], ["a", "b"])
        self.assertEqual([a.tensor for a in graph.nodes[0].args], ["a", "b"])

    def test_non_tensor_inputs_are_constants(self):
        def scale(x, factor):
            return x * factor

        graph = kiln.capture(scale, torch.randn(4), 3, name="scale_by_3")
        self.assertEqual(graph.name, "scale_by_3")
        self.assertEqual(len(graph.inputs), 1)
        self.assertEqual(graph.nodes[0].args[1].int_value, 3)

    def test_tensor_constants_are_refused(self):
        bias = torch.randn(4)

        def add_bias(x):
            return x + bias

        with self.assertRaisesRegex(ValueError, "constant"):
            kiln.capture(add_bias, torch.randn(4))

    def test_signature(self):
        x = torch.randn(4, 6)[:, 1:]
        sig = kiln.signature(x, torch.ones(2, dtype=torch.int32))
        self.assertEqual(len(sig.inputs), 2)
        self.assertEqual(list(sig.inputs[0].sizes), [4, 5])
        self.assertEqual(list(sig.inputs[0].strides), [6, 1])
        self.assertEqual(sig.inputs[0].storage_offset, 1)
        self.assertEqual(sig.inputs[0].dtype, graph_pb2.FLOAT32)
        self.assertEqual(sig.inputs[0].device.type, "cpu")
        self.assertEqual(sig.inputs[1].dtype, graph_pb2.INT32)
        # It describes the same inputs as the captured graph's metadata.
        model = capture_graphs.RMSNorm(8)
        x = torch.randn(3, 8)
        graph = kiln.capture(model, x)
        sig = kiln.signature(*kiln.module_tensors(model), x)
        for ph, entry in zip(graph.inputs, sig.inputs):
            self.assertEqual([s.int_value for s in ph.value.meta.sizes], list(entry.sizes))
            self.assertEqual([s.int_value for s in ph.value.meta.strides], list(entry.strides))
            self.assertEqual(ph.value.meta.requires_grad, entry.requires_grad)

    def test_json_round_trip(self):
        for file_name, graph in capture_graphs.graphs():
            with self.subTest(graph=file_name):
                text = json_format.MessageToJson(service_pb2.GraphFile(graph=graph), indent=1)
                back = json_format.Parse(text, service_pb2.GraphFile())
                self.assertEqual(back.graph, graph)
                self.assertEqual(back.graph.SerializeToString(deterministic=True),
                                 graph.SerializeToString(deterministic=True))


class GraphFilesTest(unittest.TestCase):
    """The checked-in files in tests/data/graphs."""

    def test_files_parse_as_graph_files(self):
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(GRAPHS_DIR, "*.json")))
        for name in ("attention.json", "conv_block.json", "mlp.json", "rmsnorm.json"):
            self.assertIn(name, files)
        for name in files:
            with self.subTest(file=name):
                with open(os.path.join(GRAPHS_DIR, name)) as f:
                    graph_file = json_format.Parse(f.read(), service_pb2.GraphFile())
                self.assertTrue(graph_file.HasField("graph"))
                check_graph(self, graph_file.graph)

    def test_files_match_a_fresh_capture(self):
        for file_name, graph in capture_graphs.graphs():
            with self.subTest(graph=file_name):
                with open(os.path.join(GRAPHS_DIR, file_name)) as f:
                    stored = json_format.Parse(f.read(), service_pb2.GraphFile()).graph
                self.assertEqual(stored, graph,
                                 f"{file_name} is stale: rerun tests/data/capture_graphs.py")


if __name__ == "__main__":
    unittest.main()
