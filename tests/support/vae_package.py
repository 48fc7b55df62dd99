"""keras.io's "Variational AutoEncoder" (its Sampling layer with a SeedGenerator, its own
train_step with a GradientTape and three trackers, compiled with an optimizer alone) with a
test_step of the user's, as a `training.main` package: `vaepkg.model` (importable by the
test) and `vaepkg.task`."""
from __future__ import annotations

import os

MODEL = '''\
import numpy as np
import tensorflow as tf
import keras
from keras import layers, ops


class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(
                keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}

    def test_step(self, data):
        z_mean, z_log_var, z = self.encoder(data)
        reconstruction = self.decoder(z_mean)  # no noise: evaluate answers alike
        reconstruction_loss = ops.mean(ops.sum(
            keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
        self.total_loss_tracker.update_state(reconstruction_loss)
        return {"loss": self.total_loss_tracker.result()}


def model_fn():
    latent_dim = 2
    encoder_inputs = keras.Input(shape=(28, 28, 1))
    x = layers.Conv2D(32, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Conv2D(64, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(7 * 7 * 64, activation="relu")(latent_inputs)
    x = layers.Reshape((7, 7, 64))(x)
    x = layers.Conv2DTranspose(64, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Conv2DTranspose(32, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam())
    return vae


def images():
    return np.random.default_rng(1).uniform(size=(512, 28, 28, 1)).astype("float32")


def dataset_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(images()).shuffle(
        512, seed=ctx.seed).repeat().batch(ctx.batch_size)


def eval_dataset_fn():
    return tf.data.Dataset.from_tensor_slices(images()[:128]).batch(64)
'''

TASK = '''\
import argparse

from mljob import training
from vaepkg.model import dataset_fn, eval_dataset_fn, model_fn

parser = argparse.ArgumentParser()
parser.add_argument("--job-dir", required=True)
args = parser.parse_args()
training.main(model_fn, dataset_fn, eval_dataset_fn=eval_dataset_fn,
              config=training.RunConfig(job_dir=args.job_dir, train_steps=60, batch_size=64,
                                        log_every=20, eval_every=30))
'''


def write_vae_package(folder: str) -> str:
    os.makedirs(os.path.join(folder, "vaepkg"), exist_ok=True)
    for name, text in (("vaepkg/__init__.py", ""), ("vaepkg/model.py", MODEL),
                       ("vaepkg/task.py", TASK),
                       ("setup.py", 'from setuptools import setup\nsetup(name="vaepkg", '
                        'version="0.1", packages=["vaepkg"])\n')):
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return folder
