/* pins.c - pinned repo+revision digests, the same table as the files in manifests/pins/
 * (tests/test_manifest.c checks that they agree, and against the shared pin
 * list). Embedded so the binary needs no data files. */
#include "verify_int.h"

#include <string.h>

static const struct sfwi_pin_file minicpm_sala_9180fe1[] = {
    {"11ad7efa24975ee4b0c3c3a38ed18737f0658a5f75a0a96787b576a78a023361", ".gitattributes"},
    {"1011dc15ae0051403227e7feeaeba79f9635028549cdb105f79718e6551a1b0d", "README.md"},
    {"cd6d042c4d8d5e32f7809c366d209bb183704bc2917bec5f162f36fb7439955c", "config.json"},
    {"0bd0668a2c771911c6cc5bf64481a28b23a56aa63dbb60cbc9c75031b6b2cae2", "configuration_minicpm_sala.py"},
    {"43b983b5c0d531f0955a4ac30259feb424adb67a0193419957b46dc175fabcb0", "generation_config.json"},
    {"c78212b9421a7f674a0cbce97cd584884f275f381d576973bc0e6dad33a1b31f", "model-00001-of-00004.safetensors"},
    {"1e93182ef3c7715d3659d297839f2340df869770e6a494f7fc8cce1fdef1eeed", "model-00002-of-00004.safetensors"},
    {"7c9a8cc00265c89b922b3d3020925b0b39cd0ca99ed9dcd951aea6e52f491286", "model-00003-of-00004.safetensors"},
    {"a34680df5ba413ff78e1b1faa5c3e4b83a18c07fd54b71fc51cbcb1ec0d995ea", "model-00004-of-00004.safetensors"},
    {"1ebcdab945038e00c1149d3d30e68855af80c4d3a3bb49d1ee5ae9ed5fcc00bb", "model.safetensors.index.json"},
    {"b6060c08cfd45868f0e90726e48292689b15f01bf9828cf07f6257530477719c", "modeling_minicpm_sala.py"},
    {"ddea9320bf580e177483618f0baacadb4365c9bcd26a6a793d8b6ca2534932c8", "special_tokens_map.json"},
    {"f6c51b273a33a35eab2af6d9ee20f047f81ba911ef0f8305b19c83aeb0940918", "tokenizer.json"},
    {"bb74d51116831c3bf65db812c553f94ab0c88dcf97a5bbb37e3504f6d359c530", "tokenizer.model"},
    {"381178d4203cf5c2cbe27e5c56e217ba915873a95ca3df5dba8e29068e596ed9", "tokenizer_config.json"},
};

static const struct sfwi_pin pins[] = {
    {"openbmb/MiniCPM-SALA", "9180fe1db74f71fb81bc7105efe88f6b19c959b0",
     "2263a168d94c135114578ce8ca12f8d227cab567a5ba9b4e5cff929ed7247d87", "2DC28CC7B26A283B",
     minicpm_sala_9180fe1, sizeof(minicpm_sala_9180fe1) / sizeof(minicpm_sala_9180fe1[0])},
};

const struct sfwi_pin *sfwi_pin_find(const char *repo_id, const char *revision)
{
	for (size_t i = 0; i < sizeof(pins) / sizeof(pins[0]); i++)
		if (strcmp(pins[i].repo_id, repo_id) == 0 && strcmp(pins[i].revision, revision) == 0)
			return &pins[i];
	return NULL;
}

const struct sfwi_pin *sfwi_pins(size_t *n)
{
	*n = sizeof(pins) / sizeof(pins[0]);
	return pins;
}
